"""The generated protobuf/gRPC modules (built with the package; in a checkout, generated on demand: see ``_proto``).

``v1`` holds the ``kvtier.v1`` messages (``v1.LookupRequest``, ``v1.Block``, ...), ``wire``
the data plane's metadata messages (``wire.WireReadRequest``, ...),
``v1_grpc`` the ``KvTierStub``; ``kvstore`` / ``kvstore_grpc`` the seed's
``kvstore.KVStoreService`` API.
"""
from ._proto import load as _load

_m = _load()
v1 = _m.v1
v1_grpc = _m.v1_grpc
wire = _m.wire
kvstore = _m.kvstore
kvstore_grpc = _m.kvstore_grpc

__all__ = ["v1", "v1_grpc", "wire", "kvstore", "kvstore_grpc"]
