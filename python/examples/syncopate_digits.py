"""A training script as people write it for PyTorch DDP (ddp_digits.py) and the same script
converted to syncopate (syncopate_digits.py, 8 lines changed): an MLP with a BatchNorm layer on
the digits data, AdamW, a linear warm-up (LambdaLR), gradient clipping and gradient
accumulation over 2 micro-batches. Run either with `torchrun --nproc_per_node 2 SCRIPT`."""

import torch
import syncopate.torch as st

import syncopate

EPOCHS, BATCH, ACCUMULATE = 6, 16, 2


def main() -> None:
    st.init("bsp")
    rank, world = st.rank(), st.world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = {k: torch.from_numpy(v) for k, v in syncopate.load_digits().items()}
    train = torch.utils.data.TensorDataset(data["x_train"], data["y_train"])
    sampler = torch.utils.data.DistributedSampler(train, num_replicas=world, rank=rank, seed=0)
    loader = torch.utils.data.DataLoader(train, batch_size=BATCH, sampler=sampler, drop_last=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    opt = st.DistributedOptimizer(opt, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 10))
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUMULATE
            loss.backward()
            if (i + 1) % ACCUMULATE == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step(loss=loss)
                sched.step()
                opt.zero_grad()
    model.eval()
    with torch.no_grad():
        accuracy = (model(data["x_test"]).argmax(1) == data["y_test"]).float().mean().item()
    print(f"rank {rank}: test accuracy {accuracy:.3f}")
    st.shutdown()


if __name__ == "__main__":
    main()
