"""The learner processes of one node cannot be reached from the network (issue 44, item 2): their rendezvous is a
file store in a folder only this user can open, and the process group's own sockets are bound to the loopback
interface, so no socket of theirs listens on an address another machine can reach (torch's TCPStore, asked for
127.0.0.1, listened on every interface; rank 0 unpickles what the others send through the group)."""

import ipaddress
import multiprocessing as mp
import os
import socket
import stat

import psutil
import torch


def _listening(pid: int) -> list[tuple[str, int]]:
    p = psutil.Process(pid)
    conns = p.net_connections(kind="inet") if hasattr(p, "net_connections") else p.connections(kind="inet")
    return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]


def _rank(rank: int, rendezvous: str, out) -> None:
    import torch.distributed as dist

    from rlbalance.core import distributed

    distributed.init(rank, 2, torch.device("cpu"), rendezvous, timeout_s=60)
    try:
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)  # the group's pairs are connected now
        listening = _listening(os.getpid())
        # while the group is live: a connection from this machine's own non-loopback addresses to any of them
        reached = []
        for addr in _other_addresses():
            for _, port in listening:
                with socket.socket() as s:
                    s.settimeout(2)
                    if s.connect_ex((addr, port)) == 0:
                        reached.append((addr, port))
        out[rank] = {"sum": float(t.item()), "listening": listening, "reached": reached}
        dist.barrier()
    finally:
        distributed.close()


def _other_addresses() -> list[str]:
    """This machine's addresses that are not loopback (what another machine would connect to)."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback]


def test_learner_ranks_listen_on_no_address_but_loopback():
    from rlbalance.core.distributed import close_rendezvous, private_rendezvous

    rendezvous = private_rendezvous()
    folder = os.path.dirname(rendezvous)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700  # only this user opens the store
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        procs = [ctx.Process(target=_rank, args=(r, rendezvous, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        res = dict(out)
    close_rendezvous(rendezvous)
    assert not os.path.exists(folder)
    assert res[0]["sum"] == res[1]["sum"] == 3.0
    for r in (0, 1):
        for ip, port in res[r]["listening"]:
            assert ipaddress.ip_address(ip).is_loopback, (r, ip, port)  # never 0.0.0.0, ::, or a host address
        assert res[r]["reached"] == []  # no connection from a non-loopback address got through
