// Command reaper-podlost serves the podlost reaper plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/plugins/podlost"
	"github.com/dexaflow/reaper/sdk/plugin"
)

func main() { plugin.Serve(podlost.New) }
