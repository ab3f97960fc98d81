// Command reaper-substrate-lite serves the Lite substrate plugin (local
// processes) to reaperd.
package main

import (
	"github.com/dexaflow/reaper/sdk/plugin"
	"github.com/dexaflow/reaper/substrate/lite"
)

func main() { plugin.Serve(lite.New) }
