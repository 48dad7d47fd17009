"""The worker of bench/convergence_bench.py: a small transformer language model, trained with DDP
(gloo) and one gradient compression, on text every CPython ships (pydoc_data.topics: the
language reference's topics, about 465 KB), so that the modes' losses differ where an MLP on the
digits could not tell them apart.

    dist-launch --nproc-per-node 2 bench/convergence_torch.py --hook none|fp16|powersgd:4|dist:SPEC
        [--steps 600]

The model: bytes in, a 2-layer causal transformer (width 128, 4 heads, feed-forward 256, context
64), bytes out; about 0.3 M parameters. Each rank reads its own batches (16 windows a step, drawn
by a generator seeded by rank) from the first 90% of the text; Adam, lr 3e-3. Rank 0 prints the
training steps' time and the loss on 64 fixed windows of the last 10% (bits per byte) every 100
steps and at the end. Hooks: torch's own (`fp16`, `powersgd:R`) or dist_launch.compression's
(`dist:SPEC`).
"""
import argparse
import math
import time

import pydoc_data.topics
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from compression_torch import register  # the same hooks, by the same --hook names

CONTEXT = 64
WIDTH = 128


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(256, WIDTH)
        self.position = torch.nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 4, dim_feedforward=256, dropout=0.0,
                                                 batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, 2)
        self.out = torch.nn.Linear(WIDTH, 256)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(CONTEXT))

    def forward(self, x):
        h = self.layers(self.embed(x) + self.position, mask=self.mask)
        return self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hook", default="none")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    text = "".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    split = len(data) * 9 // 10
    train, held_out = data[:split], data[split:]
    test_starts = torch.linspace(0, len(held_out) - CONTEXT - 2, 64).long()
    test_x = torch.stack([held_out[s:s + CONTEXT] for s in test_starts])
    test_y = torch.stack([held_out[s + 1:s + CONTEXT + 1] for s in test_starts])

    torch.manual_seed(0)
    model = DDP(Model())
    state = register(model, args.hook)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    draw = torch.Generator().manual_seed(1000 + rank)

    def held_out_bits():
        with torch.no_grad():
            logits = model.module(test_x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), test_y.reshape(-1))
        return loss.item() / math.log(2)

    seconds = 0.0
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(train) - CONTEXT - 1, (args.batch,), generator=draw)
        x = torch.stack([train[s:s + CONTEXT] for s in starts])
        y = torch.stack([train[s + 1:s + CONTEXT + 1] for s in starts])
        begin = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        seconds += time.perf_counter() - begin
        if rank == 0 and (step % 100 == 0 or step == args.steps):
            print(f"step {step}: held-out {held_out_bits():.4f} bits per byte", flush=True)
    if rank == 0:
        parameters = sum(p.numel() for p in model.parameters())
        print(f"torch {torch.__version__} hook {args.hook}: {parameters} parameters, "
              f"{args.steps} steps in {seconds:.3f} s of training steps", flush=True)
        print(f"final held-out loss {held_out_bits():.4f} bits per byte", flush=True)
        if state is not None:
            print(f"compression stats {state.stats()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
