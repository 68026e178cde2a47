"""What TLS costs on the check-in path: check-ins per second against one gRPC server over
plaintext and over mutual TLS, in the same run (≤ 60 s with the defaults).

The server is bench/gateway.py's (no database), so the figures bound the transport's share
of a check-in from above: the real gateway adds a database read per check-in on both rows.
Two ways of calling: one long-lived channel per client thread (what an agent does), and a
new connection per check-in (a full TLS handshake each time: the worst case, e.g. agents
behind NATs that drop idle connections).

The rows alternate over --rounds rounds and each row reports its median, so a neighbour's
load on a shared machine hits both transports alike.

    python bench/gateway_tls.py [--seconds 4] [--rounds 3] [--threads 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway import CA, ENROL_PORTS, BenchGateway, serve  # noqa: E402  (bench/ is not a package)

from agent.client import GatewayClient  # noqa: E402
from deploy.package import generate_keypair  # noqa: E402
from deploy.proto import agent_pb2, agent_pb2_grpc  # noqa: E402
from deploy.trust import certificates  # noqa: E402

ATTRS = agent_pb2.DeviceAttributes(hardware="bench", os="linux", agent_version="bench")


def _plaintext(port: int):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = agent_pb2_grpc.AgentGatewayStub(channel)
    return channel, lambda: stub.CheckIn(agent_pb2.CheckInRequest(attributes=ATTRS), timeout=10)


def _mutual(port: int, identity: tuple[bytes, bytes]):
    key, cert = identity
    client = GatewayClient(f"127.0.0.1:{port}", ca_pem=CA.certificate_pem, key_pem=key, certificate_pem=cert)
    return client, lambda: client.check_in(ATTRS, "", "")


def measure(connect, seconds: float, threads: int, fresh: bool) -> float:
    """Check-ins per second over all threads; fresh: a new connection for every check-in."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def work(i: int) -> None:
        channel, call = connect()
        while time.monotonic() < stop:
            if fresh:
                channel.close()
                channel, call = connect()
            call()
            counts[i] += 1
        channel.close()

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per row and round (4 rows)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="concurrent clients")
    args = parser.parse_args()
    server, port = serve(BenchGateway(generate_keypair().public_key), workers=8, plaintext_port=True)
    plain = ENROL_PORTS[-port]
    key = certificates.create_private_key()
    issued = certificates.sign_client_certificate(
        CA, certificates.create_csr(key), device_id="00000000-0000-4000-8000-00000000be0c"
    )
    identity = (key, issued.certificate_pem)
    connections = {
        "plaintext": lambda: _plaintext(plain),
        "mutual TLS": lambda: _mutual(port, identity),
    }
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        for connect in connections.values():
            measure(connect, 1.0, args.threads, fresh=False)  # warm-up
        for _ in range(args.rounds):
            for fresh in (False, True):
                for name, connect in connections.items():
                    how = "new connection each" if fresh else "long-lived channel"
                    rates.setdefault((name, how), []).append(
                        measure(connect, args.seconds, args.threads, fresh)
                    )
        rows = [(name, how, statistics.median(r)) for (name, how), r in rates.items()]
    finally:
        server.stop(grace=None)
    print(f"{'transport':<12} {'connections':<22} {'check-ins/s':>12}")
    for name, how, rate in rows:
        print(f"{name:<12} {how:<22} {rate:>12.0f}")
    for how in ("long-lived channel", "new connection each"):
        plain_rate, tls_rate = (r for n, h, r in rows if h == how)
        print(f"TLS costs {100 * (1 - tls_rate / plain_rate):.0f}% of check-ins/s ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
