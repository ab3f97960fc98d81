package daemon

import (
	"context"
	"fmt"
	"sync"
)

// A component is one of the daemon's long-running parts, in the shape of
// controller-runtime's Runnables: the maintenance loop (host/cycle), the
// attempt API (runner/attemptapi) and the runner (runner/literunner or
// runner/kuberunner). Run runs it until ctx is done and then returns nil;
// a component that returns before that stops reaperd with its error.
//
// A component that needs leadership writes under the elector's term (and
// asks the elector for it each cycle): Run stops it before the elector
// resigns, so that no write of a term is in flight once another replica
// may take over. The others serve every replica, leading or not, and are
// stopped last.
type component interface {
	Run(ctx context.Context) error
	NeedsLeadership() bool
}

// named is a component with the name the logs give it.
type named struct {
	name string
	component
}

type components []named

// namedErr is what one component's Run returned.
type namedErr struct {
	name string
	err  error
}

// start runs each component on a goroutine of its own. A component that
// returns while ctx is live is handed to fatal. The channel receives what
// each returned, and is closed once all have.
func (cs components) start(ctx context.Context, fatal func(error)) <-chan namedErr {
	done := make(chan namedErr, len(cs))
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Run(ctx)
			if ctx.Err() == nil {
				if err == nil {
					err = fmt.Errorf("%s stopped on its own", c.name)
				}
				fatal(fmt.Errorf("%s: %w", c.name, err))
			}
			done <- namedErr{c.name, err}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}
