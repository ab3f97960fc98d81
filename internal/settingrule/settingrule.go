// Package settingrule is how a component's settings refuse a value of the
// block an operator wrote, without knowing the file: the keys that set it
// and why. host/config places each refusal at the first of its keys the
// block sets (else at the block) as a file:line:column diagnostic.
package settingrule

// Problem is a value of a block the block's rules refuse.
type Problem struct {
	// Keys are the attributes the refusal is about, the one to point at
	// first; none, or none set in the block: the block itself.
	Keys []string
	// Summary heads the diagnostic; "": `Invalid value for "<first key>"`.
	Summary string
	// Detail says why, in a sentence.
	Detail string
}

// At is the refusal of the value of key, for detail.
func At(key, detail string) Problem {
	return Problem{Keys: []string{key}, Detail: detail}
}
