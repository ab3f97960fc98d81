// Command reaper-substrate-kube serves the Kubernetes substrate plugin to
// reaperd.
package main

import (
	"github.com/dexaflow/reaper/sdk/plugin"
	"github.com/dexaflow/reaper/substrate/kube"
)

func main() { plugin.Serve(kube.New) }
