// Package scale holds the fleet-scale benchmarks behind make bench-scale
// (not part of make test): the attempt API's heartbeat rate, the reap
// passes over 10,000, 50,000 and 150,000 running attempts of each edition,
// podlost's full walk alone over 50,000 and 150,000 (its cache filled by a
// fake API server, in seconds), the informer's bytes per pod, and the audit's explain and retention prune
// at 10,000,000 decisions. Each benchmark adds its rows to one report that
// the package's TestMain prints as a table when the run ends, each figure
// beside its aim.
//
//	make bench-scale
package scale
