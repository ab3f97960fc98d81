package sdk

// BuildVersion is stamped at build time (-ldflags -X); it is the version the
// binaries report.
var BuildVersion = "dev"
