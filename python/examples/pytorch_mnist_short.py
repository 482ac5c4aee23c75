"""Train a PyTorch CNN on MNIST with syncopate: a parameter server in this process and
WORKERS worker processes over TCP, until the test accuracy reaches 0.90."""

import multiprocessing

import torch

import syncopate
import syncopate.torch as st

WORKERS, PROTOCOL, TARGET = 2, "bsp", 0.90


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # every process builds the same model; the server's copy is the one used
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(256, 10),
    )


def mnist(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = syncopate.load_mnist5k()  # 4,000 training and 1,000 test images, shipped with syncopate
    return torch.from_numpy(data[f"x_{split}"]).view(-1, 1, 28, 28), torch.from_numpy(data[f"y_{split}"])


def worker(address: str, rank: int) -> None:
    torch.set_num_threads(1)
    batches = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*mnist("train")), batch_size=32, shuffle=True,
                                          generator=torch.Generator().manual_seed(rank))  # a shuffle per worker
    st.train_worker(make_model(), torch.nn.functional.cross_entropy, batches, connect=address, id=rank)


def main() -> None:
    model, (x_test, y_test) = make_model(), mnist("test")

    def accuracy(params) -> float:  # called by the server every 50 updates, on its live model
        st.load_vector(model, params)
        with torch.no_grad():
            return (model(x_test).argmax(1) == y_test).float().mean().item()

    workers = []

    def start_workers(address: str) -> None:  # called once the server listens
        for rank in range(WORKERS):
            workers.append(multiprocessing.get_context("spawn").Process(target=worker, args=(address, rank)))
            workers[-1].start()

    protocol = syncopate.Protocol(PROTOCOL, workers=WORKERS, lr=0.1)
    report = syncopate.serve(st.parameters_vector(model), protocol, evaluate=accuracy, every=50,
                             target=TARGET, updates=5000, on_listen=start_workers)
    for p in workers:
        p.join()
    print(f"{PROTOCOL}: test accuracy {report['evaluation']:.3f} after {report['updates']} updates, "
          f"{report['wall_s']:.1f} s of training")


if __name__ == "__main__":
    main()
