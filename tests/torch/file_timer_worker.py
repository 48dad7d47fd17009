"""A torch worker on torch's own FileTimerClient (torch.distributed.elastic.timer), for
file_timer_test.py: on the attempts named by --hang-on-attempt it sets a timer it releases, then one
it never releases, and hangs past it; on the others it says where its timer pipe is and exits 0."""
import argparse
import os
import time

import torch.distributed.elastic.timer as timer

parser = argparse.ArgumentParser()
parser.add_argument("--hang-on-attempt", type=int, action="append", default=[])
args = parser.parse_args()

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
pipe = os.environ["TORCHELASTIC_TIMER_FILE"]
timer.configure(timer.FileTimerClient(pipe))  # torch's default: SIGKILL on expiry
if attempt in args.hang_on_attempt:
    with timer.expires(after=0.2, scope="released"):
        pass
    with timer.expires(after=0.5, scope="train_step"):
        time.sleep(600)
print(f"attempt {attempt} done, timers at {pipe}", flush=True)
