"""The committed gRPC stubs must be what grpcio-tools makes of agent.proto today."""

from pathlib import Path

from deploy.proto.generate import ROOT, generate


def test_committed_stubs_are_fresh(tmp_path: Path):
    fresh = generate(tmp_path)
    assert [p.name for p in fresh] == ["agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py"]
    for path in fresh:
        committed = ROOT / "deploy" / "proto" / path.name
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `make proto`"


def test_platform_is_not_a_package_and_stdlib_platform_still_works():
    import platform

    assert not (ROOT / "platform" / "__init__.py").exists()
    assert platform.system()  # the standard library's module, not our folder
    assert Path(platform.__file__).parent != ROOT / "platform"
