"""Generated protobuf and gRPC stubs for the Deniable v1 contract."""
