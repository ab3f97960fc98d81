// Command reaper-substrate-kube serves the Kubernetes substrate plugin to
// reaperd.
package main

import (
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/substrate/kube"
)

func main() { sdk.Serve(kube.New) }
