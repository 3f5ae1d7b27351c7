"""The DeepCAM-like training job every rank runs (bare metal and in containers alike).

DeepCAM (MLPerf HPC) segments climate simulation output per pixel into
background, tropical cyclones and atmospheric rivers with an
encoder-decoder CNN. This is the same task in small: ``--samples`` fields
of ``--channels`` smooth random channels (Gaussian-filtered white noise,
generated per sample from ``--seed``, so every run and every rank sees the
same data set), labelled by thresholds (a "cyclone" where the first channel
is low and the second high, a "river" where the third is high), a small
U-Net trained for ``--epochs`` epochs with Adam on a weighted cross-entropy
(the background dominates, as in DeepCAM).

Data parallel with ``torch.distributed`` (gloo over loopback): rank and
world size come from Slurm (SLURM_PROCID, SLURM_NTASKS), rank 0 serves the
rendezvous on ``--master-port``. The global batch is ``--batch``, split
over the ranks (strong scaling); each rank generates only its shard.

Every rank prints one line::

    DEEPCAM rank=R first_line=T1 first_iter=T2 end=T3 first_loss=L0 last_loss=L1 checksum=C

with wall-clock times (seconds since the epoch, one clock for every "node"
of the machine): T1 at the script's first line, T2 when the first training
iteration starts (imports, data, model, process group done), T3 after the
last. Losses are the global mean of the first and last epoch; the checksum
sums the trained parameters (equal on every rank when DDP did its job).
Only the standard library is imported before T1 is taken.
"""

import time

FIRST_LINE = time.time()

import argparse  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--samples", type=int, required=True, help="samples in the global data set")
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=144)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--batch", type=int, required=True, help="global batch size (a multiple of the ranks)")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--seed", type=int, default=2026)
    return parser.parse_args()


def climate_fields(np, seed: int, index: int, channels: int, height: int, width: int):
    """One sample: ``channels`` smooth fields (zero mean, unit variance) and per-pixel labels."""
    rng = np.random.default_rng([seed, index])
    noise = rng.standard_normal((channels, height, width))
    ky = np.fft.fftfreq(height)[:, None]
    kx = np.fft.rfftfreq(width)[None, :]
    smooth = np.exp(-(kx**2 + ky**2) / (2 * 0.04**2))  # a correlation length of a few pixels
    fields = np.fft.irfft2(np.fft.rfft2(noise) * smooth, s=(height, width))
    fields = (fields - fields.mean(axis=(1, 2), keepdims=True)) / fields.std(axis=(1, 2), keepdims=True)
    labels = np.zeros((height, width), dtype=np.int64)
    labels[fields[2 % channels] > 1.2] = 2  # "atmospheric river"
    labels[(fields[0] < -1.0) & (fields[1 % channels] > 0.5)] = 1  # "tropical cyclone"
    return fields.astype(np.float32), labels


def build_model(torch, channels: int, classes: int = 3):
    nn = torch.nn

    def block(c_in, c_out):
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))

    class UNet(nn.Module):
        """Two levels down, two up, with skip connections (DeepCAM's DeepLabv3+ in small)."""

        def __init__(self):
            super().__init__()
            self.enc1 = nn.Sequential(block(channels, 16), block(16, 16))
            self.enc2 = block(16, 32)
            self.bottom = block(32, 64)
            self.up2 = nn.ConvTranspose2d(64, 32, 2, stride=2)
            self.dec2 = block(64, 32)
            self.up1 = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.dec1 = block(32, 16)
            self.head = nn.Conv2d(16, classes, 1)
            self.pool = nn.MaxPool2d(2)

        def forward(self, x):
            s1 = self.enc1(x)
            s2 = self.enc2(self.pool(s1))
            y = self.bottom(self.pool(s2))
            y = self.dec2(torch.cat([self.up2(y), s2], 1))
            y = self.dec1(torch.cat([self.up1(y), s1], 1))
            return self.head(y)

    return UNet()


def main() -> None:
    args = arguments()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    if args.batch % world:
        raise SystemExit(f"the global batch ({args.batch}) must be a multiple of the ranks ({world})")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the fake nodes talk over loopback
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(args.threads)
    mine = range(rank, args.samples, world)
    samples = [climate_fields(np, args.seed, i, args.channels, args.height, args.width) for i in mine]
    inputs = torch.from_numpy(np.stack([s[0] for s in samples]))
    labels = torch.from_numpy(np.stack([s[1] for s in samples]))

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(build_model(torch, args.channels))  # broadcasts rank 0's weights
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = torch.nn.CrossEntropyLoss(weight=torch.tensor([0.2, 1.0, 1.0]))
    local_batch = args.batch // world
    steps = len(mine) // local_batch
    if steps == 0:
        raise SystemExit(f"rank {rank} has {len(mine)} samples, fewer than one batch of {local_batch}")
    dist.barrier()

    first_iter = time.time()
    epoch_losses = []
    for _ in range(args.epochs):
        total = torch.zeros(1)
        for step in range(steps):
            batch = slice(step * local_batch, (step + 1) * local_batch)
            optimizer.zero_grad()
            loss = loss_fn(model(inputs[batch]), labels[batch])
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            total += loss.detach()
        epoch_losses.append(total / steps)
    end = time.time()

    losses = torch.cat([epoch_losses[0], epoch_losses[-1]])
    dist.all_reduce(losses)
    losses /= world
    checksum = sum(float(p.detach().double().abs().sum()) for p in model.parameters())
    print(
        f"DEEPCAM rank={rank} first_line={FIRST_LINE:.6f} first_iter={first_iter:.6f} end={end:.6f} "
        f"first_loss={losses[0]:.6f} last_loss={losses[1]:.6f} checksum={checksum:.6f}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
