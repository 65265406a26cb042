package protocol

// The protobuf plugins are pinned by go.mod's tool lines; protoc itself comes
// from Debian's protobuf-compiler (3.21.12), which .ci/run installs.
//go:generate go build -o ../../bin/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc
//go:generate protoc -I ../../proto --plugin=protoc-gen-go=../../bin/protoc-gen-go --plugin=protoc-gen-go-grpc=../../bin/protoc-gen-go-grpc --go_out=../.. --go_opt=module=github.com/drover-fleet/drover --go-grpc_out=../.. --go-grpc_opt=module=github.com/drover-fleet/drover drover/agent/v1/agent.proto drover/operator/v1/operator.proto drover/signer/v1/signer.proto drover/session/v1/session.proto drover/sessionapi/v1/sessionapi.proto
