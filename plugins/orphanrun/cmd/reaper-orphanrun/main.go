// Command reaper-orphanrun serves the orphanrun reaper plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/plugins/orphanrun"
	"github.com/dexaflow/reaper/sdk"
)

func main() { sdk.Serve(orphanrun.New) }
