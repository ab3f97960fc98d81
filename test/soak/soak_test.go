package soak

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dexaflow/reaper/board"
	"github.com/dexaflow/reaper/board/lifecycle"
	"github.com/dexaflow/reaper/runner/agent"
	"github.com/dexaflow/reaper/runner/attemptapi/attemptapitest"
	"github.com/dexaflow/reaper/sdk"
	"github.com/dexaflow/reaper/testkit/boardhistory"
)

// Environment of `make soak`.
const (
	soakEnv = "REAPER_SOAK"      // the soak's duration; unset: TestSoak skips
	seedEnv = "REAPER_SOAK_SEED" // the seed to replay; unset: a new one
	binEnv  = "REAPER_SOAK_BIN"  // the directory `make build` filled
)

// checkEvery is how often the invariants are judged while the system runs.
const checkEvery = 5 * time.Second

// recoveryBound is how long after the last fault every run must be final:
// the specification's worst case, max(dispatch_lost, orphan_run) plus one
// interval, plus what the soak's own faults and tasks add to it — a
// leadership change just before the end (the lease, then the settling
// grace of the new term), an orphan stop (grace and kill wait), a task
// re-placed and run again from the start (its longest run, twice for a
// retry), and the runner's ticks between the rails.
const recoveryBound = max(dispatchLost, orphanRun) + interval +
	lease + grace + stopGrace + killWait + 2*longestTask + 4*runnerTick

// soak is one soak run.
type soak struct {
	t       *testing.T
	seed    uint64
	dur     time.Duration
	bin     string
	tl      timeline
	edition string
	node    string // on kube: nodeKWOK (KWOK nodes, the kubelet player) or nodeReal

	dir, recordDir, logDir, journalDir, escDir, tmpDir string
	mark                                               string

	db      *database
	pool    *pgxpool.Pool
	store   *board.Store
	daemons []*daemon
	obs     *observer
	wl      *workload
	inj     *injector
	kube    *kubeWorld // the cluster side; nil on Lite
	cancel  context.CancelFunc

	mu         sync.Mutex
	violations []Violation
	passed     map[string]int // checks judged clean, by invariant
	decisions  []Decision
	lastAudit  int64
	heartbeats map[sdk.Attempt][]time.Time // landed, by attempt
	lastBeat   int64
	out        *os.File // the report, as it is written
	// fenceRefused is, by replica slot and pid, the most writes its fence
	// refused that its telemetry showed (fenceCounts).
	fenceRefused map[string]float64
	// fenceSeen is, by the same key, when its count was last read, and
	// fenceRises every increase read (watchNemeses, fenceCounts).
	fenceSeen  map[string]time.Time
	fenceRises []fenceRise
	// leaderSamples are the looks at the leader row (watchNemeses).
	leaderSamples []leaderSample
	// historyPath is the run's fault history, once written (judgeHistory).
	historyPath string
	// readGen counts the times the soak forgot what it had read of the
	// audit and the heartbeats (forgetRead: an asynchronous failover lost
	// rows); a read begun before is dropped.
	readGen int
}

func (s *soak) logf(format string, args ...any) {
	line := fmt.Sprintf("%8.1fs  ", time.Since(s.tl.wall).Seconds()) + fmt.Sprintf(format, args...)
	fmt.Println(line)
}

// fail records a violation and ends the soak.
func (s *soak) fail(v Violation) {
	s.mu.Lock()
	s.violations = append(s.violations, v)
	s.mu.Unlock()
	s.logf("VIOLATION %s", v)
	if s.cancel != nil {
		s.cancel()
	}
}

func (s *soak) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.violations) > 0
}

func TestSoak(t *testing.T) {
	durText := os.Getenv(soakEnv)
	if durText == "" {
		t.Skip("the soak runs under `make soak` (" + soakEnv + "=duration)")
	}
	dur, err := time.ParseDuration(durText)
	if err != nil || dur <= 0 {
		t.Fatalf("%s=%q: want a positive duration", soakEnv, durText)
	}
	seed := newSeed()
	if text := os.Getenv(seedEnv); text != "" {
		if seed, err = strconv.ParseUint(text, 10, 64); err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", seedEnv, text)
		}
	}
	bin := os.Getenv(binEnv)
	if bin == "" {
		t.Fatalf("%s must name the directory of the built binaries (make soak sets it)", binEnv)
	}
	edition := os.Getenv(editionEnv)
	switch edition {
	case "":
		edition = editionLite
	case editionLite, editionKube:
	default:
		t.Fatalf("%s=%q: want %s or %s", editionEnv, edition, editionLite, editionKube)
	}
	node, replay := os.Getenv(nodeEnv), ""
	switch {
	case node == "" || node == nodeKWOK:
		node = nodeKWOK
	case node == nodeReal && edition == editionKube:
		replay = " NODE=" + nodeReal
	default:
		t.Fatalf("%s=%q: want %s (the default) or, on the kube edition, %s", nodeEnv, node, nodeKWOK, nodeReal)
	}
	s := &soak{t: t, seed: seed, dur: dur, bin: bin, tl: newTimeline(), passed: map[string]int{}, edition: edition,
		node: node}
	s.logf("soak: %s edition, seed %d, %s (replay: make soak EDITION=%s%s SEED=%d SOAK=%s)", edition, seed, dur,
		edition, replay, seed, dur)
	s.run()
}

func newSeed() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func (s *soak) run() {
	t := s.t
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer s.cleanup()
	s.setup(ctx)

	// The soak's own clock of phases: cancel ends the fault phase early on
	// a violation.
	faultCtx, stopFaults := context.WithTimeout(ctx, s.dur)
	defer stopFaults()
	s.cancel = stopFaults

	obsCtx, stopObs := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); s.obs.run(obsCtx, 100*time.Millisecond) }()
	go func() { defer bg.Done(); s.watchNemeses(obsCtx) }()
	defer func() { stopObs(); bg.Wait() }()

	for _, d := range s.daemons {
		if err := d.start(); err != nil {
			t.Fatal(err)
		}
	}
	s.logf("PostgreSQL and %d reaperd replicas up; runs and faults start", len(s.daemons))

	var phase sync.WaitGroup
	phase.Add(3)
	go func() { defer phase.Done(); s.wl.stream(faultCtx) }()
	go func() {
		defer phase.Done()
		// The first faults wait for a leader to settle.
		sleep(faultCtx, grace+lease)
		s.inj.run(faultCtx)
	}()
	go func() { defer phase.Done(); s.checkLoop(faultCtx) }()
	phase.Wait()
	quiet := s.tl.now()
	s.logf("faults stopped (every paused process resumed, every replica running); recovery bound %s", s.recoveryBound())

	if !s.failed() {
		s.awaitRecovery(ctx, quiet)
	}
	// Last look: the observer sees the final exits, then the invariants
	// are judged on the whole history.
	sleep(ctx, time.Second)
	if !s.failed() {
		s.check(ctx)
	}
	if !s.failed() && s.kube != nil && s.kube.real != nil {
		s.kube.checkJournals(ctx)
	}
	s.fenceCounts(ctx)
	s.stopAll()
	s.report(ctx, quiet)
}

// setup makes the soak's directories, database and replicas (not started).
func (s *soak) setup(ctx context.Context) {
	t := s.t
	var b [4]byte
	_, _ = crand.Read(b[:])
	s.mark = "soak-" + hex.EncodeToString(b[:])
	dir, err := os.MkdirTemp("", "reaper-soak-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	_ = os.Chmod(dir, 0o755) // the database server's account reaches its directory through it
	s.recordDir = filepath.Join(dir, "records")
	s.logDir = filepath.Join(dir, "logs")
	s.journalDir = filepath.Join(dir, "journals")
	s.escDir = filepath.Join(dir, "escaped")
	s.tmpDir = filepath.Join(dir, "tmp")
	for _, d := range []string{s.logDir, s.journalDir, s.escDir, s.tmpDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	s.logf("soak directory %s", dir)

	s.db, err = startDatabase(ctx, dir, replicas) // every replica linked: the nemeses cut the links
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "REAPER_DSN=", "TMPDIR="+s.tmpDir, agent.JournalDirEnv+"="+s.journalDir,
		markEnv+"="+s.mark, escEnv+"="+s.escDir)
	config := filepath.Join(dir, "reaperd.hcl")
	hcl := configHCL(s.bin, s.db.dsn, s.recordDir, s.logDir, attemptapitest.FreeAddr(t), filepath.Join(dir, "attempt-api"))
	executor, shapes, weights := sdk.ExecutorLite, taskKinds, faultWeights
	switch {
	case s.edition == editionKube && s.node == nodeReal:
		s.startKubeReal(ctx)
		hcl = realKubeConfigHCL(s.bin, s.db.dsn, s.kube.c.Kubeconfig(), s.kube.ns, s.kube,
			filepath.Join(dir, "attempt-api"))
		executor, shapes, weights = sdk.ExecutorKube, kubeTaskKinds(), realFaultWeights
		s.logf("kube-apiserver, controller manager and the real node %s up (Ready in %s; kubelet, containerd, runc)",
			s.kube.real.Name, s.kube.real.Ready.Round(time.Millisecond))
	case s.edition == editionKube:
		s.startKube(ctx, env)
		hcl = kubeConfigHCL(s.bin, s.db.dsn, s.kube.c.Kubeconfig(), s.kube.ns, attemptapitest.FreeAddr(t),
			filepath.Join(dir, "attempt-api"))
		executor, shapes, weights = sdk.ExecutorKube, kubeTaskKinds(), kubeFaultWeights
		s.logf("kube-apiserver, KWOK (controller manager: %t), %d nodes and the kubelet player up",
			s.kube.c.HasControllerManager(), kubeNodes)
	}
	if err := os.WriteFile(config, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"validate", "migrate"} {
		cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "reaperd"), step, "-config", config)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("reaperd %s: %v\n%s", step, err, out)
		}
	}
	if s.pool, err = pgxpool.New(ctx, s.db.dsn); err != nil {
		t.Fatal(err)
	}
	if err := boardhistory.Install(ctx, s.pool); err != nil {
		t.Fatal(err)
	}
	s.store = board.New(s.pool, board.Options{})
	configs := slices.Repeat([]string{config}, replicas)
	if s.kube != nil {
		// Each its own path to the API server too: what the injector cuts.
		if configs, err = s.kube.replicaConfigs(dir, config, replicas); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= replicas; i++ {
		denv := env
		if l := s.db.link(i); l != nil {
			// Its own path to the database (REAPER_DSN overrides the
			// configuration's store.dsn): what the injector cuts.
			denv = append(append([]string(nil), env...), "REAPER_DSN="+l.dsn)
		}
		s.daemons = append(s.daemons, &daemon{slot: i, bin: s.bin, config: configs[i-1], env: denv, logDir: s.logDir})
	}
	s.obs = newObserver(s.journalDir, s.tl)
	if s.kube != nil && s.kube.real != nil {
		// The journals are brought out of the pods beside them, and the
		// pids they name are their pods' own.
		s.obs = newObserver(s.kube.journals.dst, s.tl)
		s.obs.resolve = s.kube.pids.resolve
	}
	s.wl = &workload{w: lifecycle.New(s.pool, lifecycle.Options{}), rng: rand.New(rand.NewPCG(s.seed, 1)),
		tl: s.tl, kinds: map[string]int{}, executor: executor, shapes: shapes}
	if s.kube != nil && s.kube.real != nil {
		s.wl.gap = realStreamGap
	}
	s.inj = newInjector(s, weights)
}

// checkLoop judges the invariants every checkEvery until ctx ends.
func (s *soak) checkLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(checkEvery):
		}
		s.check(ctx)
		s.fenceCounts(ctx)
	}
}

// check builds the history and judges it.
func (s *soak) check(ctx context.Context) {
	h, err := s.history(context.WithoutCancel(ctx))
	if err != nil {
		return // the database is restarting: judge at the next check
	}
	for name, vs := range CheckAll(h) {
		if len(vs) == 0 {
			s.mu.Lock()
			s.passed[name]++
			s.mu.Unlock()
			continue
		}
		for _, v := range vs {
			s.fail(v)
		}
	}
}

// history gathers the three accounts. The observer is read after the
// database, so a process the database saw marked has had its last sight
// taken after the mark.
func (s *soak) history(ctx context.Context) (History, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var h History
	if s.kube != nil {
		// The pod stops before the faults: the injector records a deletion
		// or an eviction before its request, so every stop of its own read
		// here has its fault in the list read next, however long the reads
		// in between take (a frozen database holds them for seconds).
		h.PodStops = s.kube.podStops()
	}
	h.Faults = s.inj.list()
	var err error
	if h.Transitions, err = boardhistory.Transitions(ctx, s.pool); err != nil {
		return h, err
	}
	if h.RunChanges, err = boardhistory.RunChanges(ctx, s.pool); err != nil {
		return h, err
	}
	if h.Terms, err = boardhistory.Terms(ctx, s.pool); err != nil {
		return h, err
	}
	if err := s.readAudit(ctx); err != nil {
		return h, err
	}
	if err := s.readHeartbeats(ctx); err != nil {
		return h, err
	}
	s.mu.Lock()
	h.Decisions = append([]Decision(nil), s.decisions...)
	h.Heartbeats = make(map[sdk.Attempt][]time.Time, len(s.heartbeats))
	for a, bs := range s.heartbeats {
		h.Heartbeats[a] = append([]time.Time(nil), bs...)
	}
	s.mu.Unlock()
	if s.kube != nil {
		h.AgentLost = agentLost
	}
	s.obs.poll()
	s.obs.snapshot(&h)
	h.Now = s.tl.now()
	return h, nil
}

// readAudit reads the audit rows added since the last read.
func (s *soak) readAudit(ctx context.Context) error {
	s.mu.Lock()
	after, gen := s.lastAudit, s.readGen
	s.mu.Unlock()
	rows, err := s.pool.Query(ctx, `SELECT id, at, term, reaper, label, applied, coalesce(run_id, ''),
	        coalesce(task_id, ''), coalesce(try_number, 0), coalesce(attempt_epoch, 0)
	    FROM reap_decisions WHERE id > $1 ORDER BY id`, after)
	if err != nil {
		return err
	}
	defer rows.Close()
	var ds []Decision
	for rows.Next() {
		var d Decision
		if err := rows.Scan(&d.ID, &d.At, &d.Term, &d.Reaper, &d.Label, &d.Applied, &d.Attempt.RunID,
			&d.Attempt.TaskID, &d.Attempt.Try, &d.Attempt.Epoch); err != nil {
			return err
		}
		ds = append(ds, d)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.readGen {
		return nil // read from a board since lost
	}
	s.decisions = append(s.decisions, ds...)
	if len(ds) > 0 {
		s.lastAudit = ds[len(ds)-1].ID
	}
	return nil
}

// readHeartbeats reads the heartbeats landed since the last read.
func (s *soak) readHeartbeats(ctx context.Context) error {
	s.mu.Lock()
	after, gen := s.lastBeat, s.readGen
	s.mu.Unlock()
	beats, last, err := boardhistory.Heartbeats(ctx, s.pool, after)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.readGen {
		return nil // read from a board since lost
	}
	if s.heartbeats == nil {
		s.heartbeats = map[sdk.Attempt][]time.Time{}
	}
	for _, b := range beats {
		s.heartbeats[b.Attempt] = append(s.heartbeats[b.Attempt], b.At)
	}
	s.lastBeat = last
	return nil
}

// leaderDaemon is the replica holding the lease now, and how many others
// are running and not paused.
func (s *soak) leaderDaemon() (*daemon, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l, ok, err := s.store.CurrentLeader(ctx)
	if err != nil || !ok || !l.Held(time.Now()) {
		return nil, 0
	}
	pid := holderPID(l.Holder)
	var leader *daemon
	others := 0
	for _, d := range s.daemons {
		switch {
		case d.pid() == pid && d.usable():
			leader = d
		case d.usable():
			others++
		}
	}
	return leader, others
}

// awaitRecovery waits until every run on the board is final and no
// attempt is queued or running, for at most recoveryBound after quiet.
func (s *soak) awaitRecovery(ctx context.Context, quiet time.Time) {
	deadline := quiet.Add(s.recoveryBound())
	for {
		runs, live, err := s.unsettled(ctx)
		if err == nil && len(runs) == 0 && len(live) == 0 {
			s.logf("every run final %.1fs after the faults stopped", s.tl.now().Sub(quiet).Seconds())
			s.mu.Lock()
			s.passed[BoundedRecovery]++
			s.mu.Unlock()
			return
		}
		if s.tl.now().After(deadline) {
			for _, v := range Unsettled(runs, live, deadline) {
				s.fail(v)
			}
			return
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// recoveryBound is the edition's bound on recovery after the last fault.
func (s *soak) recoveryBound() time.Duration {
	if s.kube != nil {
		return kubeRecoveryBound
	}
	return recoveryBound
}

// unsettled reads the runs not final and the attempts queued or running.
func (s *soak) unsettled(ctx context.Context) (map[string]string, []sdk.Attempt, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	runs := map[string]string{}
	rows, err := s.pool.Query(ctx, `SELECT run_id, state FROM runs WHERE state NOT IN ('success', 'failed') ORDER BY run_id`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			rows.Close()
			return nil, nil, err
		}
		runs[id] = st
	}
	rows.Close()
	rows, err = s.pool.Query(ctx, `SELECT run_id, task_id, try_number, attempt_epoch FROM task_instances
	    WHERE state IN ('queued', 'running') ORDER BY run_id, task_id`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var live []sdk.Attempt
	for rows.Next() {
		var a sdk.Attempt
		if err := rows.Scan(&a.RunID, &a.TaskID, &a.Try, &a.Epoch); err != nil {
			return nil, nil, err
		}
		live = append(live, a)
	}
	return runs, live, rows.Err()
}

// marked reports whether pid carries the soak's marker.
func (s *soak) marked(pid int) bool {
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	return err == nil && bytes.Contains(env, []byte(markEnv+"="+s.mark+"\x00"))
}

// leftovers lists what outlives the soak: processes carrying its marker,
// records in its record directory, sockets in its temporary directory.
func (s *soak) leftovers() []string {
	var out []string
	for pid, p := range scanProcs() {
		if !p.info.Zombie && s.marked(pid) {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			out = append(out, fmt.Sprintf("process %d (%s): %s", pid, p.comm, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
	}
	for _, root := range []string{s.recordDir, s.tmpDir} {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(s.dir, path)
			switch {
			case d.Type()&fs.ModeSocket != 0:
				out = append(out, "socket "+rel)
			case strings.HasSuffix(path, ".pid") || strings.HasSuffix(path, ".pgid"):
				out = append(out, "record "+rel)
			}
			return nil
		})
	}
	if s.kube != nil {
		out = append(out, s.kube.leftovers()...)
	}
	sort.Strings(out)
	return out
}

// stopAll stops the replicas, waits for the soak's processes to end (an
// escaped child lives out its sleep) and judges what is left behind.
func (s *soak) stopAll() {
	for _, d := range s.daemons {
		if !d.stop(30 * time.Second) {
			s.logf("reaperd #%d did not stop within 30s of SIGTERM: killed", d.slot)
		}
	}
	if s.failed() {
		// Stopped early on a violation: agents may still be at work, their
		// control plane gone. The first violation is the evidence.
		for _, l := range s.leftovers() {
			s.logf("left at the early stop: %s", l)
		}
		return
	}
	deadline := time.Now().Add(escapeLife + 5*time.Second)
	var left []string
	for {
		left = s.leftovers()
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(left) == 0 {
		s.mu.Lock()
		s.passed[NothingLeftBehind]++
		s.mu.Unlock()
		return
	}
	for _, l := range left {
		s.fail(Violation{Check: NothingLeftBehind, Evidence: l})
	}
}

// cleanup makes sure nothing of the soak runs on, stops the database, and
// removes the soak's directory unless the soak failed (its logs and
// journals are the evidence).
func (s *soak) cleanup() {
	for _, d := range s.daemons {
		d.stop(10 * time.Second)
	}
	if s.kube != nil {
		s.kube.stop()
	}
	for pid, p := range scanProcs() {
		if !p.info.Zombie && s.marked(pid) {
			_ = syscallKill(pid)
		}
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if s.db != nil {
		if err := s.db.stop(); err != nil {
			s.logf("stop postgres: %v", err)
		}
	}
	if s.dir == "" {
		return
	}
	if s.failed() || s.t.Failed() {
		s.logf("soak FAILED; its logs and journals are kept in %s", s.dir)
		s.mu.Lock()
		for _, v := range s.violations {
			s.t.Errorf("%s", v)
		}
		s.mu.Unlock()
		return
	}
	kept := ""
	if s.historyPath != "" {
		// The history outlives the directory: anyone can judge it again.
		if err := os.Rename(s.historyPath, s.dir+"."+historyFile); err == nil {
			kept = "; its history is kept in " + s.dir + "." + historyFile
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		s.logf("remove %s: %v", s.dir, err)
	}
	s.logf("soak passed; its directory is removed%s", kept)
}
