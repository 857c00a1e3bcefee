"""A follower rank of a tensor-parallel engine: `python -m radixserve.engine.tp.worker`.

Spawned by rank 0 (`launch.TPLeader`). It builds its model-runner shard, then replays rank 0's step
plans until a shutdown plan arrives, the group fails, or its stdin (a pipe from rank 0) closes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from radixserve.engine.config import EngineConfig
from radixserve.engine.device import resolve_device, resolve_dtype
from radixserve.engine.distributed import (
    CollectiveGuard,
    CommSetup,
    TPGroupError,
    create_comm,
    set_comm,
)
from radixserve.engine.model_runner import ForwardOutput, ModelRunner
from radixserve.engine.models.config import ModelArgs, read_eos_ids
from radixserve.engine.tp.channel import HEARTBEAT_S, ControlChannel, open_channel
from radixserve.engine.tp.launch import rank_device
from radixserve.engine.tp.plan import PlanDecoder


def _exit_with_rank0() -> None:
    # The raw descriptor, not sys.stdin: a thread blocked inside the buffered reader holds its
    # lock, and the interpreter aborts when it cannot take that lock at exit.
    while os.read(sys.stdin.fileno(), 4096):  # b"" at EOF: rank 0 closed the pipe or exited
        pass
    os._exit(0)


def _leave(code: int) -> NoReturn:
    """End the process without the interpreter's teardown.

    gloo's worker threads drop a collective's tensors after its caller has moved on, and dropping
    the last reference to a tensor that Python created takes the GIL. If that happens while the
    interpreter finalises, Python ends the thread (pthread_exit) inside a C++ destructor, and the
    process dies of SIGABRT instead of exiting with `code`. After a shutdown plan this rank has
    left its group already; either way the kernel reclaims what is left (sockets, the channel's
    mapping), so only stdio is flushed.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _beat(channel: ControlChannel) -> None:
    """Rank 0's watchdog takes a rank whose count stops growing for stopped or frozen."""
    while True:
        channel.beat()
        time.sleep(HEARTBEAT_S)


def run(config: EngineConfig, store_host: str, store_port: int) -> None:
    rank, tp = config.tp_rank, config.tp_size
    folder = Path(config.model_path)
    args = ModelArgs.from_folder(folder)
    device = rank_device(resolve_device(config.device), rank, tp)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))  # ranks share the host's cores
    timeout = datetime.timedelta(seconds=config.tp_timeout_s)
    store = dist.TCPStore(store_host, store_port, tp, is_master=False, timeout=timeout)
    store.set(f"joined/{rank}", "1")
    guard = CollectiveGuard(rank, lambda: "rank 0 stopped answering (it may have exited)")
    comm = create_comm(config.tp_comm, CommSetup(rank, tp, device, store, config.tp_timeout_s,
                                                 guard))
    channel = open_channel(config.tp_control, rank, tp, store, guard)
    threading.Thread(target=_beat, args=(channel,), daemon=True, name="heartbeat").start()
    set_comm(comm)
    dtype = resolve_dtype(config.dtype, args.dtype, device)
    runner = ModelRunner(config, args, device, dtype, read_eos_ids(folder))
    store.set(f"ready/{rank}", "1")  # what rank 0's constructor waits for
    decoder = PlanDecoder(runner.table)
    previous: ForwardOutput | None = None
    while (batch := decoder.decode(channel.recv())) is not None:
        launched = runner.forward(batch)
        if previous is not None:  # step N - 1 done before N + 1 is planned (see ForwardOutput)
            previous.wait()
        previous = launched
    comm.close()  # the heartbeat thread dies with the process, so the channel stays open


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A follower rank of a tensor-parallel radixserve "
                                             "engine")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--store", required=True, help="host:port of rank 0's TCP store")
    ap.add_argument("--config", required=True, help="this rank's EngineConfig as JSON")
    a = ap.parse_args(argv)
    config = EngineConfig(**json.loads(a.config))
    if config.tp_rank != a.rank:
        ap.error(f"--rank {a.rank} disagrees with the config's tp_rank {config.tp_rank}")
    threading.Thread(target=_exit_with_rank0, daemon=True, name="rank0-watchdog").start()
    host, port = a.store.rsplit(":", 1)
    try:
        run(config, host, int(port))
    except TPGroupError as e:
        print(f"radixserve TP worker rank {a.rank}: {e}", file=sys.stderr)
        _leave(1)
    except Exception:  # a bug: its traceback goes to rank 0's stderr, the exit code says failed
        traceback.print_exc()
        _leave(1)
    _leave(0)


if __name__ == "__main__":
    main()
