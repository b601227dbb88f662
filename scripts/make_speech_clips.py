"""Synthesise the spoken-word clips of the ``spoken_words_audio`` task once, with Debian's ``espeak-ng``.

    apt-get install -y espeak-ng
    .venv/bin/python scripts/make_speech_clips.py      # writes src/grpolab/policies/speech_to_text/clips/

Each of the corpus's 16 words (``zero`` ... ``nine``, ``yes``, ``no``, ``up``, ``down``, ``go``, ``stop``) is spoken
by :data:`VOICES` (espeak-ng voices: American and British English, a female variant) at :data:`SPEEDS` words per
minute: ``espeak-ng -v VOICE -s SPEED -w out.wav WORD`` (22,050 Hz mono), leading and trailing silence trimmed
(samples below 1 % of the clip's peak), resampled to 16 kHz (``scipy.signal.resample_poly(x, 320, 441)``), peak
normalised to 0.9 and written as 16-bit FLAC, ``<word>-<voice>-<speed>.flac``. ``clips.json`` lists them with the
espeak-ng version. The files are committed (about 0.6 MB); the task reads them and never calls espeak-ng.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "grpolab" / "policies" / "speech_to_text" / "clips"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "yes", "no", "up", "down", "go", "stop")
VOICES = ("en-us", "en-gb+f3")
SPEEDS = (150, 200)
RATE = 16000


def speak(word: str, voice: str, speed: int) -> np.ndarray:
    """espeak-ng's rendering of ``word`` as trimmed, peak-normalised float32 samples at 16 kHz."""
    import soundfile as sf
    from scipy.signal import resample_poly

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "w.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(wav), word], check=True)
        x, sr = sf.read(wav, dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    loud = np.flatnonzero(np.abs(x) > 0.01 * np.abs(x).max())
    x = x[loud[0]:loud[-1] + 1]
    if sr != RATE:
        from math import gcd
        g = gcd(sr, RATE)
        x = resample_poly(x, RATE // g, sr // g)
    return (0.9 * x / np.abs(x).max()).astype(np.float32)


def main() -> int:
    import soundfile as sf

    version = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    version = version.split("Data at")[0].strip()  # "eSpeak NG text-to-speech: 1.51"
    OUT.mkdir(parents=True, exist_ok=True)
    listing = []
    for word in WORDS:
        for voice in VOICES:
            for speed in SPEEDS:
                name = f"{word}-{voice.replace('+', '_')}-{speed}.flac"
                x = speak(word, voice, speed)
                sf.write(OUT / name, x, RATE, format="FLAC", subtype="PCM_16")
                listing.append({"file": name, "word": word, "voice": voice, "speed_wpm": speed,
                                "seconds": round(len(x) / RATE, 3)})
    (OUT / "clips.json").write_text(json.dumps({"espeak_ng": version, "sampling_rate": RATE,
                                                "clips": listing}, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.glob("*.flac"))
    print(f"{len(listing)} clips, {total / 1e6:.2f} MB in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
