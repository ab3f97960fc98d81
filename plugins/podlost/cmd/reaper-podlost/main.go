// Command reaper-podlost serves the podlost reaper plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/sdk"
)

func main() { sdk.Serve(podlost.New) }
