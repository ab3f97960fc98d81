// Command reaper-orphanrun serves the orphanrun reaper plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/sdk/plugin"
)

func main() { plugin.Serve(orphanrun.New) }
