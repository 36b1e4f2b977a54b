"""Recipe: .wav files -> log-mel spectrograms (numpy only) in a shardkit dataset.

    python pipelines/byo_logmel.py WAV_FOLDER OUT --seconds 2 --n-mels 64 --workers 2

Each 16-bit PCM .wav (mono, or channels averaged) is cut or zero-padded to --seconds, then turned
into a float32 (n_mels, frames) log-mel array: a Hann-windowed STFT (n_fft 400, hop 160: 25 ms /
10 ms at 16 kHz), power spectrum, HTK mel filterbank, log(x + 1e-6). Every array has one shape, so
the loader stacks them without padding. Stored: `mel` and, under `json`, the rate and the length in
seconds before cutting. A file that is not 16-bit PCM, or whose rate differs from --rate, is recorded
in errors.jsonl.
"""

from __future__ import annotations

import argparse
import functools
import os
import wave

import numpy as np

from shardkit import build_map
from shardkit.sample import make_key

N_FFT, HOP = 400, 160


def mel_filters(rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular HTK mel filters from 0 Hz to rate / 2."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    hz = lambda m: 700.0 * (10 ** (m / 2595.0) - 1.0)  # noqa: E731
    edges = hz(np.linspace(mel(0.0), mel(rate / 2), n_mels + 2))
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    return np.maximum(0.0, np.minimum(lower, upper))


def log_mel(signal: np.ndarray, rate: int, n_mels: int) -> np.ndarray:
    frames = 1 + (len(signal) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(signal[idx] * np.hanning(N_FFT), axis=1)) ** 2  # (frames, n_fft // 2 + 1)
    return np.log(mel_filters(rate, N_FFT, n_mels) @ spec.T + 1e-6).astype(np.float32)


def read_wav(path: str) -> tuple[np.ndarray, int]:
    """Samples in [-1, 1) as float64 (channels averaged), and the rate."""
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{8 * w.getsampwidth()}-bit samples; this recipe reads 16-bit PCM (convert with sox/ffmpeg)")
        rate, channels, data = w.getframerate(), w.getnchannels(), w.readframes(w.getnframes())
    pcm = np.frombuffer(data, "<i2").reshape(-1, channels).mean(axis=1)
    return pcm / 32768.0, rate


def load_wav(path: str, *, root: str, rate: int, seconds: float, n_mels: int) -> dict:
    signal, got = read_wav(path)
    if got != rate:
        raise ValueError(f"sample rate {got} Hz; expected {rate} (resample first, or pass --rate {got})")
    n = int(round(seconds * rate))
    fixed = np.zeros(n)
    fixed[:min(n, len(signal))] = signal[:n]
    rel = os.path.relpath(path, root)
    return {"__key__": make_key(os.path.splitext(rel)[0]), "mel": log_mel(fixed, rate, n_mels),
            "json": {"rate": rate, "seconds": round(len(signal) / rate, 4)}}


def build(folder: str, out: str, *, rate: int = 16000, seconds: float = 2.0, n_mels: int = 64,
          workers: int | None = None, worker_pool: str = "auto", progress: bool = True):
    root = os.path.abspath(folder)
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.lower().endswith(".wav"))
    fn = functools.partial(load_wav, root=root, rate=rate, seconds=seconds, n_mels=n_mels)
    return build_map(fn, paths, out, workers=workers, worker_pool=worker_pool, progress=progress)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("--rate", type=int, default=16000)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--n-mels", type=int, default=64)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--worker-pool", default="auto", choices=["auto", "threads", "processes"])
    a = p.parse_args(argv)
    r = build(a.folder, a.out, rate=a.rate, seconds=a.seconds, n_mels=a.n_mels, workers=a.workers,
              worker_pool=a.worker_pool)
    print(f"{r.samples} clips written to {r.out}, {len(r.rejections)} rejected (see errors.jsonl)")


if __name__ == "__main__":
    main()
