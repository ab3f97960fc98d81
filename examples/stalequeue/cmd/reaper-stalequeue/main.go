// Command reaper-stalequeue serves the example plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/examples/stalequeue"
	"github.com/dexaflow/reaper/sdk/plugin"
)

func main() { plugin.Serve(stalequeue.New) }
