package board

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/sdk"
)

// Defaults of Options.
const (
	// LeaderNameDefault names the leader row the host's lease lives in.
	LeaderNameDefault = "reaperd"
	// QueryTimeoutDefault bounds every call's database work.
	QueryTimeoutDefault = 10 * time.Second
)

// ErrNotFound is returned by reads of a row that does not exist.
var ErrNotFound = errors.New("not found")

// ErrDeposed is returned by a term-fenced write other than a mark (marks
// report it per mark instead) when the term is no longer the current one.
var ErrDeposed = errors.New("leadership term is not current")

// Options configure a Store.
type Options struct {
	// LeaderName is the leader row that fences writes and holds the lease.
	// Default LeaderNameDefault.
	LeaderName string
	// Holder is this replica's name in the leader row (the holder it
	// acquires leadership as). Set, a fenced write applies only while the
	// row names this holder as well as the write's term: a term number
	// handed out twice (a failover to a standby that missed the increment)
	// fences out the replica that held it first. Empty: the term alone
	// (tools and tests that write as no replica).
	Holder string
	// QueryTimeout bounds the database work of one call; <= 0 means
	// QueryTimeoutDefault.
	QueryTimeout time.Duration
	// CredentialCeiling is auth.max_attempt_credential_lifetime: a
	// settlement that asks for a sensor's reschedule at or past it, counted
	// from the first dispatch of the try, fails the task instead
	// (sdk.Sensor.RescheduleRefusal). <= 0: none.
	CredentialCeiling time.Duration
	// Observer hears of tenants' text made safe and of a batch's rows
	// refused alone (log and meter them); nil: no one.
	Observer Observer
	// Scoring says which audited decisions the leader scores
	// (reap_decisions.scored): NewScoring of the configured reapers; the
	// zero Scoring goes by the sdk's built-in lists.
	Scoring Scoring
}

// Store is the board over a PostgreSQL pool. It is safe for concurrent use.
type Store struct {
	pool     *pgxpool.Pool
	leader   string
	holder   string
	timeout  time.Duration
	ceiling  time.Duration
	packer   evidencePacker // the audit's evidence encoder (read only)
	observer Observer
	scoring  Scoring // read only
}

var _ sdk.Board = (*Store)(nil)

// New returns a Store over pool. The pool stays the caller's to close.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.LeaderName == "" {
		opts.LeaderName = LeaderNameDefault
	}
	if opts.QueryTimeout <= 0 {
		opts.QueryTimeout = QueryTimeoutDefault
	}
	return &Store{pool: pool, leader: opts.LeaderName, holder: opts.Holder, timeout: opts.QueryTimeout, ceiling: opts.CredentialCeiling,
		packer: newEvidencePacker(), observer: opts.Observer, scoring: opts.Scoring}
}

// leaderRow is the condition that picks the board's leader row for a
// fenced write: $1 is fenceKey's pair, the row's name and the writing
// replica's holder (empty: any holder).
const leaderRow = `name = ($1::text[])[1] AND (($1::text[])[2] = '' OR holder = ($1::text[])[2])`

// fenceKey is $1 of a statement fenced with leaderRow.
func (s *Store) fenceKey() []string { return []string{s.leader, s.holder} }

// Pool returns the pool the store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// bound gives one call its share of time.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// The enumerations of the schema, for validating input before it reaches SQL
// (some of it is inlined into statements as literals).
var (
	// The words a state or an executor may be: lists, whose strings a scan
	// hands out (closedWord), and the same as sets, for validating input.
	stateWords    = sdk.TaskStates()
	executorWords = []string{sdk.ExecutorKube, sdk.ExecutorLite, sdk.ExecutorWarm}
	taskStates    = setOf(stateWords)
	executors     = setOf(executorWords)
)

func setOf(vals []string) map[string]bool {
	m := make(map[string]bool, len(vals))
	for _, v := range vals {
		m[v] = true
	}
	return m
}

// IsTaskState reports whether s is a task instance state.
func IsTaskState(s string) bool { return taskStates[s] }

// IsExecutor reports whether e is an executor.
func IsExecutor(e string) bool { return executors[e] }

// timeOrZero turns NULL into a zero time.
func timeOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
