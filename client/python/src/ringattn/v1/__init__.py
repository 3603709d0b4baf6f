"""Protobuf and gRPC stubs of the ringattn.v1 API, generated at build time.

attention_pb2 / attention_pb2_grpc come from proto/ringattn/v1/attention.proto
(see client/python/setup.py); worker_pb2 is the internal coordinator/worker API.
"""
