package plugin

import (
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// callbackServer is the host's side of the broker: the board and the
// executions a plugin calls back into during a pass or a sweep. It is served
// once per plugin client, on one broker id, for as long as the plugin lives;
// each call installs the values it was given before the request goes out.
type callbackServer struct {
	broker  *plugin.GRPCBroker
	maxRecv int // 0: gRPC's default

	once sync.Once
	id   uint32

	mu    sync.RWMutex
	board sdk.Board
	exec  sdk.Executions
}

func newCallbackServer(broker *plugin.GRPCBroker, maxRecv int) *callbackServer {
	return &callbackServer{broker: broker, maxRecv: maxRecv}
}

// serve installs board and exec and returns the broker id they are served
// on, starting the server on first use. The server stops with the broker,
// that is when the plugin client is killed.
func (c *callbackServer) serve(board sdk.Board, exec sdk.Executions) uint32 {
	c.mu.Lock()
	c.board, c.exec = board, exec
	c.mu.Unlock()
	c.once.Do(func() {
		c.id = c.broker.NextId()
		go c.broker.AcceptAndServe(c.id, func(opts []grpc.ServerOption) *grpc.Server {
			if c.maxRecv > 0 {
				opts = append(opts, grpc.MaxRecvMsgSize(c.maxRecv))
			}
			s := grpc.NewServer(ServerOptions(opts...)...)
			pb.RegisterBoardServer(s, &boardServer{get: c.currentBoard})
			pb.RegisterSubstrateServer(s, &substrateServer{getExec: c.currentExec})
			return s
		})
	})
	return c.id
}

var errNoCallback = errors.New("not served by the host for this call")

func (c *callbackServer) currentBoard() (sdk.Board, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.board == nil {
		return nil, fmt.Errorf("board: %w", errNoCallback)
	}
	return c.board, nil
}

func (c *callbackServer) currentExec() (sdk.Executions, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.exec == nil {
		return nil, fmt.Errorf("substrate: %w", errNoCallback)
	}
	return c.exec, nil
}

// brokerDialer is the plugin's side: it dials the host's callback server
// once per broker id and keeps the connection for later calls.
type brokerDialer struct {
	broker *plugin.GRPCBroker
	mu     sync.Mutex
	conns  map[uint32]*grpc.ClientConn
}

func newBrokerDialer(broker *plugin.GRPCBroker) *brokerDialer {
	return &brokerDialer{broker: broker, conns: map[uint32]*grpc.ClientConn{}}
}

func (d *brokerDialer) dial(id uint32) (*grpc.ClientConn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.conns[id]; ok {
		return c, nil
	}
	c, err := d.broker.DialWithOptions(id, DialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("dial host callbacks on broker id %d: %w", id, err)
	}
	d.conns[id] = c
	return c, nil
}
