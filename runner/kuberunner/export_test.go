package kuberunner

// HeldForGhost is the dispatch's look for ghosts, for the tests of its
// guards (ghost_test.go).
var HeldForGhost = (*Runner).heldForGhost
