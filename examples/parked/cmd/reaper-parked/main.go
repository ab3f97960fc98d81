// Command reaper-parked serves the parked reaper to reaperd. Build it into
// reaperd's plugin_dir under this name and configure it with a
// reaper "parked" {} block.
package main

import (
	"github.com/dexaflow/reaper/sdk/plugin"

	"example.com/parked"
)

func main() { plugin.Serve(parked.New) }
