"""A worker of dist_launch.elastic whose send is under way when its group's connections are shut
down (elastic_test.py's StuckSend test). Rank 0 posts a receive of 256 MB from rank 1 (more than
the sockets' buffers hold), says "receiving" and is stopped by the test (SIGSTOP): it reads no
more. Rank 1 sends once the test says so on its stdin; its send stays queued for the socket. The
test then publishes generation 1, as the agent would, and rank 1's watcher shuts the group's
connections down: gloo fails the connection but not that send."""
import datetime
import os
import sys

import torch
import torch.distributed as dist
from dist_launch import elastic

elastic.GROUP_TIMEOUT = datetime.timedelta(seconds=120)  # what a stuck send would wait out
rank = int(os.environ["RANK"])
elastic.init_process_group("gloo")
tensor = torch.ones(64 * 1024 * 1024)


@elastic.run
def exchange(state):
    if rank == 0:
        work = dist.irecv(tensor, src=1)  # posted now (gloo's receive is not queued)
        print("receiving", flush=True)
        work.wait()
    else:
        print("ready", flush=True)
        sys.stdin.readline()
        print("sending", flush=True)
        dist.send(tensor, dst=0)
    print("exchanged", flush=True)


exchange(elastic.ObjectState(step=0))
