"""Build and run the gateway's gRPC server."""

from __future__ import annotations

from concurrent import futures

import grpc

from deploy.proto import agent_pb2_grpc
from gateway.servicer import AgentGatewayServicer


def build_server(address: str, *, workers: int = 16) -> tuple[grpc.Server, int]:
    """A server bound to address ("host:port"; port 0 picks a free one); returns it and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(AgentGatewayServicer(), server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot listen on {address}")
    return server, port
