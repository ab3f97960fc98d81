// The container image builder: assembles reaper's static binaries into an OCI
// image on an empty base, without a daemon or a registry. A module of its own
// so that the product's go.mod never sees go-containerregistry.
module github.com/dexaflow/reaper/tools/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
