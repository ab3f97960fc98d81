// Command reaper-dispatchlost serves the dispatchlost reaper plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/plugins/dispatchlost"
	"github.com/dexaflow/reaper/sdk/plugin"
)

func main() { plugin.Serve(dispatchlost.New) }
