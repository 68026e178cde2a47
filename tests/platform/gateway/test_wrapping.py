"""gateway.wrapping.add_intercepted: interceptors applied once per method when a servicer is
registered, instead of per call by grpc.aio."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from gateway.wrapping import add_intercepted

from deploy.proto import agent_pb2, agent_pb2_grpc


class _Counting(grpc.ServerInterceptor):
    """Wraps every unary behaviour so that each call is counted, and counts its own wrappings."""

    cacheable = True

    def __init__(self) -> None:
        self.wrapped: list[str] = []
        self.calls = 0

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        self.wrapped.append(handler_call_details.method)
        behaviour = handler.unary_unary
        if behaviour is None:
            return handler

        async def counted(request, context):
            self.calls += 1
            return await behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(
            counted,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class _Servicer(agent_pb2_grpc.AgentGatewayServicer):
    async def CheckIn(self, request, context):  # noqa: N802 (gRPC's name)
        return agent_pb2.CheckInResponse(checkin_interval_seconds=7)


class _PerCall(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        return continuation(handler_call_details)


def test_each_method_is_wrapped_once_and_every_call_goes_through_it():
    interceptor = _Counting()
    replies = asyncio.run(_three_check_ins(interceptor))
    assert [r.checkin_interval_seconds for r in replies] == [7, 7, 7]
    assert interceptor.calls == 3
    methods = agent_pb2.DESCRIPTOR.services_by_name["AgentGateway"].methods
    assert sorted(interceptor.wrapped) == sorted(f"/ferry.agent.v1.AgentGateway/{m.name}" for m in methods)


async def _three_check_ins(interceptor: _Counting) -> list:
    server = grpc.aio.server()
    add_intercepted(agent_pb2_grpc.add_AgentGatewayServicer_to_server, _Servicer(), server, [interceptor])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentGatewayStub(channel)
            replies = [await stub.CheckIn(agent_pb2.CheckInRequest()) for _ in range(3)]
    finally:
        await server.stop(None)
    return replies


def test_an_interceptor_that_wraps_per_call_is_refused():
    with pytest.raises(ValueError, match="_PerCall wraps per call"):
        add_intercepted(
            agent_pb2_grpc.add_AgentGatewayServicer_to_server, _Servicer(), object(), [_PerCall()]
        )
