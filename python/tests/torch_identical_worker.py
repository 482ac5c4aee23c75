"""One rank of a 2-worker run for test_torch_ddp.py: a BatchNorm MLP trained with the
unchanged loop (AdamW, LambdaLR, clip_grad_norm_, gradient accumulation 2), each rank on its
own data; saves model.state_dict() to OUT/rank{RANK}.pt. Usage: PROTOCOL OUT (the launcher's
variables set)."""

import sys

import torch

import syncopate.torch as st

protocol, out = sys.argv[1], sys.argv[2]
st.init(protocol, log=lambda _: None, time_limit_s=60.0)
torch.manual_seed(st.rank())  # different initial models: rank 0's must win
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
opt = st.DistributedOptimizer(opt, model)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
g = torch.Generator().manual_seed(100 + st.rank())
for step in range(12):
    opt.zero_grad()
    for micro in range(2):
        x = torch.randn(16, 8, generator=g) * (1 + st.rank())
        loss = torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()) / 2
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(loss=loss)
    sched.step()
torch.save(model.state_dict(), f"{out}/rank{st.rank()}.pt")
st.shutdown()
