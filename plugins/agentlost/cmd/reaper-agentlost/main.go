// Command reaper-agentlost serves the agentlost reaper plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/plugins/agentlost"
	"github.com/dexaflow/reaper/sdk/plugin"
)

func main() { plugin.Serve(agentlost.New) }
