// Command reaper-warmworker serves the warmworker reaper plugin to reaperd.
package main

import (
	"github.com/dexaflow/reaper/plugins/warmworker"
	"github.com/dexaflow/reaper/sdk/plugin"
)

func main() { plugin.Serve(warmworker.New) }
