// Command coredns is the test cluster's DNS: upstream CoreDNS, built from
// the module proxy with only the plugins a cluster DNS of a node with no
// upstream resolver needs. It runs as a host process; the kubelet hands its
// address to pods as their nameserver. The Corefile beside go.mod is the
// configuration it runs with.
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins linked in; each registers itself with the server.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// directives are the linked plugins in the execution order of upstream's
// plugin.cfg (which orders every plugin CoreDNS ships): a plugin sees a
// query before every plugin listed after it.
var directives = []string{
	"bind",
	"ready",
	"health",
	"errors",
	"log",
	"cache",
	"template",
	"kubernetes",
	"whoami",
}

func main() {
	if err := dnsserver.SetDirectives(directives); err != nil {
		fmt.Fprintf(os.Stderr, "coredns: setting the plugin order: %v\n", err)
		os.Exit(2)
	}
	coremain.Run()
}
