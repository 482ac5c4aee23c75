"""Train a PyTorch CNN on MNIST with your own training loop on 2 worker processes of a
syncopate run: `torchrun --nproc_per_node 2 pytorch_mnist.py`. Rank 0 hosts the server."""

import torch

import syncopate
import syncopate.torch as st

PROTOCOL, EPOCHS = "bsp", 3


def mnist(split: str) -> torch.utils.data.TensorDataset:
    data = syncopate.load_mnist5k()  # 4,000 training and 1,000 test images, shipped with syncopate
    return torch.utils.data.TensorDataset(torch.from_numpy(data[f"x_{split}"]).view(-1, 1, 28, 28),
                                          torch.from_numpy(data[f"y_{split}"]))


def main() -> None:
    st.init(PROTOCOL)  # the rank and the worker count from torchrun; rank 0 hosts the server
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train, test = mnist("train"), mnist("test")
    sampler = torch.utils.data.DistributedSampler(train, num_replicas=st.world_size(), rank=st.rank())
    loader = torch.utils.data.DataLoader(train, batch_size=32, sampler=sampler)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(256, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    opt = st.DistributedOptimizer(opt, model)  # every worker starts from rank 0's model
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, EPOCHS * len(loader))
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step(loss=loss)  # sends the gradient; AdamW applies the round's mean gradient
            sched.step()
    report = st.shutdown()  # on rank 0, the server's report; None on the others
    if report is not None:
        model.eval()
        with torch.no_grad():
            x_test, y_test = test.tensors
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        print(f"{PROTOCOL}: test accuracy {accuracy:.3f} after {report['updates']} updates, "
              f"{report['wall_s']:.1f} s of training")


if __name__ == "__main__":
    main()
