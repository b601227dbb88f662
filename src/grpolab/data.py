"""Prompt data: JSONL files, prompt formatting, completion text."""
from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path


class DataError(ValueError):
    """A malformed data file; the message names the file and line."""


class JsonlRows(list):
    """The rows of a JSONL file; ``where(i)`` names row ``i`` by its file and line (for error messages)."""

    def __init__(self, rows=(), path: Path | None = None, lines: list[int] | None = None):
        super().__init__(rows)
        self.path = path
        self.lines = lines or []

    def where(self, i: int) -> str:
        return f"{self.path}:{self.lines[i]}" if self.path is not None and i < len(self.lines) else f"row {i + 1}"


def where(rows: list, i: int) -> str:
    """``FILE:LINE`` of row ``i`` of rows read by :func:`load_jsonl`, else ``row N`` (1-based)."""
    return rows.where(i) if isinstance(rows, JsonlRows) else f"row {i + 1}"


def json_safe(obj):
    """``obj`` with every non-finite float (NaN, inf) replaced by None: JSON has no NaN, and most tools reject
    the ``NaN`` token Python's json module writes by default."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def to_json(obj, **kwargs) -> str:
    """``json.dumps`` for every file and stdout JSON grpolab writes: non-finite floats become ``null``."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


def check_prompt(prompt, at: str, column: str = "prompt") -> None:
    """A prompt is a string (TRL's "standard" format) or a non-empty list of ``{"role", "content"}`` messages
    (TRL's "conversational" format) whose contents are strings or lists of typed blocks (TRL's VLM format:
    ``{"type": "text", "text": ...}`` and ``{"type": "image"}``, :func:`check_blocks`); ``at`` names the row in
    the error."""
    ok = isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt))
    if not ok:
        raise DataError(f"{at}: '{column}' must be a string or a list of "
                        f"{{\"role\": ..., \"content\": ...}} messages, got {type(prompt).__name__} "
                        f"({str(prompt)[:40]!r})")
    if isinstance(prompt, str) and not prompt.strip():
        raise DataError(f"{at}: '{column}' is empty; every row needs a prompt")
    if isinstance(prompt, list):
        for j, m in enumerate(prompt):
            if isinstance(m["content"], list):
                check_blocks(m["content"], f"{at}: message {j + 1} of '{column}'")
            elif not isinstance(m["content"], str):
                raise DataError(f"{at}: message {j + 1} of '{column}' has a 'content' of type "
                                f"{type(m['content']).__name__} ({str(m['content'])[:40]!r}); a message's "
                                f"content must be a string (write it in quotes) or a list of "
                                f"{{\"type\": \"text\", \"text\": ...}} / {{\"type\": \"image\"}} blocks")
            if not isinstance(m["role"], str):
                raise DataError(f"{at}: message {j + 1} of '{column}' has a 'role' that is not a "
                                f"string; use \"system\", \"user\" or \"assistant\"")


BLOCK_TYPES = ("text", "image")


def check_blocks(blocks: list, at: str) -> None:
    """A message content given as typed blocks (TRL's VLM prompts): each a dict with ``type`` ``text`` (and a
    string ``text``) or ``image`` (a placeholder for one of the row's pictures; other keys, such as the ``text:
    null`` a Parquet or ``datasets`` struct column adds, are ignored)."""
    if not blocks:
        raise DataError(f"{at} has an empty list as 'content'; give a string or typed blocks")
    for k, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind not in BLOCK_TYPES:
            raise DataError(f"{at}, block {k + 1}: {str(b)[:60]!r} is not a content block; valid: "
                            f"{{\"type\": \"text\", \"text\": \"...\"}} or {{\"type\": \"image\"}} (the "
                            f"picture itself goes in the row's 'image' / 'images' column)")
        if kind == "text" and not isinstance(b.get("text"), str):
            raise DataError(f"{at}, block {k + 1}: a text block needs a string 'text', got "
                            f"{type(b.get('text')).__name__}")


def message_text(content) -> str:
    """A message's text: the string, or its text blocks joined (image blocks contribute nothing)."""
    if isinstance(content, str):
        return content
    return "".join(b["text"] for b in content or [] if isinstance(b, dict) and isinstance(b.get("text"), str)
                   and b.get("type", "text") == "text")


# ------------------------------------------------------------------ pictures (TRL's VLM data, docs/vision.md)
PICTURE_COLUMNS = ("image", "images")
_MAGIC = ((b"\x89PNG", "png"), (b"\xff\xd8", "jpeg"), (b"GIF8", "gif"), (b"RIFF", "webp"), (b"BM", "bmp"))


def _file_value(x, at: str, media: str, magic: tuple, base: Path | None):
    """A path string, or a ``datasets`` Image / Audio value read undecoded (``{"bytes": ..., "path": ...}``), as
    the loaders hand it on: encoded bytes as a ``data:<media>/<kind>`` URI (the kind from the bytes' ``magic``
    prefix), else the path; a relative path that does not exist from the working folder but does in the data
    file's folder ``base`` is taken from there."""
    import base64
    if isinstance(x, dict):
        if x.get("bytes"):
            raw = bytes(x["bytes"])
            kind = next((k for prefix, k in magic if raw.startswith(prefix)), "unknown")
            return f"data:{media}/{kind};base64," + base64.b64encode(raw).decode("ascii")
        x = x.get("path")
        if not x:
            raise DataError(f"{at}: a datasets {media.capitalize()} value with neither bytes nor a path")
    if base is not None and not x.startswith("data:") and not Path(x).is_absolute() and not Path(x).exists() \
            and (base / x).exists():
        return str(base / x)
    return x


def picture_value(x, at: str, base: Path | None = None):
    """One picture of a row in the form every loader hands on (the CLI's files and the Python API's datasets
    alike): a file path (relative paths that do not exist from the working folder are taken relative to the
    data file's folder ``base``), a ``data:image/...`` URI, or a picture object (a PIL image, an array) as a
    PNG data URI. A ``datasets.Image()`` value read undecoded (``{"bytes": ..., "path": ...}``: Parquet files,
    ``save_to_disk`` folders) becomes a data URI of its encoded bytes (no decoding) or its path."""
    if isinstance(x, (str, dict)) and (isinstance(x, str) or "bytes" in x or "path" in x):
        return _file_value(x, at, "image", _MAGIC, base)
    from .media import to_data_uri
    try:
        return to_data_uri(x)
    except ValueError as e:
        raise DataError(f"{at}: {e}") from None


def with_pictures(row: dict, at: str, base: Path | None = None) -> dict:
    """``row`` with its ``image`` / ``images`` in the form :func:`picture_value` gives (other rows unchanged)."""
    if all(row.get(c) is None for c in PICTURE_COLUMNS):
        return row
    out = dict(row)
    if out.get("image") is not None:
        out["image"] = picture_value(out["image"], f"{at} 'image'", base)
    if out.get("images") is not None:
        if isinstance(out["images"], (str, dict)) or not hasattr(out["images"], "__iter__"):
            raise DataError(f"{at}: 'images' must be a list of pictures, got {type(out['images']).__name__}; a "
                            f"single picture goes in 'image'")
        out["images"] = [picture_value(x, f"{at} 'images'[{k}]", base) for k, x in enumerate(out["images"])]
    return out


# ------------------------------------------------------------------ audio (ASR data, docs/speech.md)
_AUDIO_MAGIC = ((b"RIFF", "wav"), (b"fLaC", "flac"), (b"OggS", "ogg"), (b"ID3", "mpeg"), (b"FORM", "aiff"))


def audio_value(x, at: str, base: Path | None = None):
    """A row's ``audio`` in the form every loader hands on (JSON-safe, nothing decoded): a file path (relative
    paths that do not exist from the working folder are taken relative to the data file's folder ``base``), a
    ``data:audio/...`` URI, or ``{"array": [...], "sampling_rate": Hz}``. A ``datasets.Audio()`` value read
    undecoded (``{"bytes": ..., "path": ...}``: Parquet files, ``save_to_disk`` folders, a Dataset cast to
    ``Audio(decode=False)``) becomes a data URI of its encoded bytes or its path. The speech policy decodes
    (``policies/speech_to_text/audio.py``)."""
    if isinstance(x, dict) and "array" in x:
        arr = x["array"]
        return {**x, "array": arr.tolist() if hasattr(arr, "tolist") else arr}
    if isinstance(x, (str, dict)) and (isinstance(x, str) or "bytes" in x or "path" in x):
        return _file_value(x, at, "audio", _AUDIO_MAGIC, base)
    raise DataError(f"{at}: 'audio' must be a file path, a data:audio URI, {{\"array\": [...], \"sampling_rate\": "
                    f"Hz}} or a datasets Audio value, got {type(x).__name__}")


def with_audio(row: dict, at: str, base: Path | None = None) -> dict:
    """``row`` with its ``audio`` in the form :func:`audio_value` gives and, when it has no ``prompt`` (ASR data
    is kept as ``audio`` + ``transcript``), the prompt ``audio: <file name>`` (``audio`` for arrays and bytes):
    the text the reward functions see as the prompt. Rows without ``audio`` are unchanged."""
    if row.get("audio") is None:
        return row
    out = dict(row)
    out["audio"] = audio_value(row["audio"], f"{at} 'audio'", base)
    if "prompt" not in out:
        a = out["audio"]
        name = Path(a).name if isinstance(a, str) and not a.startswith("data:") else ""
        out["prompt"] = f"audio: {name}" if name else "audio"
    return out


def load_jsonl(path: str | Path, column_map: dict[str, str] | None = None) -> list[dict]:
    """Rows of a JSONL file. Each needs a ``prompt``: a string or a list of
    ``{"role", "content"}`` messages with string contents. Any other keys are data columns.
    ``column_map`` renames columns (``{"question": "prompt"}``) before the check.
    Returns a :class:`JsonlRows` (a list that knows each row's line)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data: file {p} does not exist")
    rows, lines = [], []
    with io.StringIO(read_text(p), newline=None) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{p}:{lineno}: each line must be a JSON object, got {type(row).__name__}")
            rows.append(_checked(rename_columns(row, column_map), f"{p}:{lineno}", column_map, p.parent))
            lines.append(lineno)
    if not rows:
        raise DataError(f"--data: {p} has no rows")
    return one_prompt_format(JsonlRows(rows, p, lines))


def read_text(p: Path) -> str:
    """The text of a UTF-8 data file; bytes that are not UTF-8 are a :class:`DataError` naming the file, the
    line, the column and the byte offset (Python's own error names only a position)."""
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{p}:{line}: not valid UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start} of the file "
                        f"(column {col} of line {line}; {e.reason}). Save the file as UTF-8 (e.g. "
                        f"`iconv -f latin1 -t utf-8`)") from None


def one_prompt_format(rows: JsonlRows) -> JsonlRows:
    """``rows``, when their prompts share one of TRL's two formats (standard: strings; conversational: chat
    messages); a data set that mixes them is a :class:`DataError` naming the first row of each kind.

    Mixed rows are refused rather than warned about: a `datasets` column has one type, so `datasets` itself
    cannot load such a file (pyarrow: "changed from string to array"), TRL treats a data set as one or the
    other, and reward functions would get completions of both shapes (strings and message lists) in one batch.
    """
    first: dict[bool, int] = {}
    for i, row in enumerate(rows):
        first.setdefault(isinstance(row["prompt"], list), i)
        if len(first) == 2:
            plain, chat = first[False], first[True]
            raise DataError(f"{rows.path}: mixes TRL's two prompt formats: {rows.where(plain)} is standard (a "
                            f"string) and {rows.where(chat)} is conversational (a list of chat messages). Write "
                            f"every prompt one way: e.g. a string s as [{{\"role\": \"user\", \"content\": s}}]")
    return rows


# ------------------------------------------------------------------ every format (docs/data.md)
DATA_FORMATS = ("jsonl", "json", "csv", "parquet", "save_to_disk folder", "dataset script/folder")


def parse_column_map(spec, prompt_column: str | None = None) -> dict[str, str]:
    """``"old:new,old2:new2"`` (or a dict) as ``{old: new}``; ``prompt_column`` adds ``{prompt_column: "prompt"}``."""
    out: dict[str, str] = {}
    if isinstance(spec, dict):
        out.update({str(k): str(v) for k, v in spec.items()})
    elif spec:
        for part in str(spec).split(","):
            old, sep, new = part.strip().partition(":")
            if not sep or not old.strip() or not new.strip():
                raise DataError(f"column_map: '{part.strip()}' is not OLD:NEW; write e.g. "
                                f"--column_map question:prompt,label:answer")
            out[old.strip()] = new.strip()
    if prompt_column and prompt_column != "prompt":
        out[prompt_column] = "prompt"
    targets = list(out.values())
    dup = sorted({t for t in targets if targets.count(t) > 1})
    if dup:
        raise DataError(f"column_map: several columns renamed to {', '.join(dup)}; each new name once")
    return out


def rename_columns(row: dict, column_map: dict[str, str] | None) -> dict:
    if not column_map:
        return row
    renamed = {column_map.get(k, k): v for k, v in row.items() if k not in column_map}
    renamed.update({column_map[k]: v for k, v in row.items() if k in column_map})
    return renamed


def _checked(row: dict, at: str, column_map: dict[str, str] | None, base: Path | None = None) -> dict:
    row = with_audio(row, at, base)  # an audio row without a prompt gets one (ASR data: audio + transcript)
    if "prompt" not in row:
        hint = ""
        if column_map:
            missing = [old for old in column_map if column_map[old] == "prompt"]
            hint = f" (column_map renames {missing[0]!r} to 'prompt', and it is not there)" if missing else ""
        raise DataError(f"{at}: missing key 'prompt'{hint} (keys: {', '.join(row) or 'none'}); name the prompt "
                        f"column with --prompt_column NAME or --column_map OLD:prompt")
    check_prompt(row["prompt"], at)
    return with_pictures(row, at, base)


def data_format(path: str | Path) -> str:
    """Which loader reads ``path``: by suffix for files; a folder is a ``save_to_disk`` folder when it holds
    ``dataset_info.json``/``dataset_dict.json`` and ``state.json`` files, else a dataset folder or script."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return "save_to_disk"
        return "datasets"
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".json":
        return "json"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".py":
        return "datasets"
    raise DataError(f"--data: {p}: unknown format '{suffix or 'no suffix'}'; valid: .jsonl, .json, .csv, .tsv, "
                    f".parquet, a datasets.save_to_disk folder, or a dataset folder/script (docs/data.md)")


def load_data(path: str | Path, split: str = "train", column_map: dict[str, str] | None = None) -> JsonlRows:
    """Rows of a data set kept in any supported format (docs/data.md), each checked as :func:`load_jsonl`
    checks a line; ``where(i)`` names the file and line (JSONL, CSV), item (JSON) or row (the others)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data: {p} does not exist")
    fmt = data_format(p)
    if fmt == "jsonl":
        return load_jsonl(p, column_map)
    if fmt == "json":
        return _load_json(p, split, column_map)
    if fmt == "csv":
        return _load_csv(p, column_map)
    return _load_with_datasets(p, fmt, split, column_map)


def _rows_of(raw: list, p: Path, at, column_map) -> JsonlRows:
    rows, labels = [], []
    for i, row in enumerate(raw):
        if not isinstance(row, dict):
            raise DataError(f"{at(i)}: each row must be an object with a 'prompt', got {type(row).__name__}")
        rows.append(_checked(rename_columns(row, column_map), at(i), column_map, p if p.is_dir() else p.parent))
        labels.append(at(i).rpartition(f"{p}:")[2])
    if not rows:
        raise DataError(f"--data: {p} has no rows")
    return one_prompt_format(JsonlRows(rows, p, labels))


def _load_json(p: Path, split: str, column_map) -> JsonlRows:
    try:
        data = json.loads(read_text(p))
    except json.JSONDecodeError as e:
        raise DataError(f"{p}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    key = ""
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if split in lists:
            key, data = split, lists[split]
        elif lists and set(data) == set(lists):
            raise DataError(f"--data: {p} has splits {', '.join(lists)} and no '{split}'; choose one with "
                            f"--data_split NAME")
        else:
            raise DataError(f"--data: {p} must hold a list of rows or {{\"{split}\": [rows]}}, got an object "
                            f"with keys {', '.join(list(data)[:8])}")
    if not isinstance(data, list):
        raise DataError(f"--data: {p} must hold a list of rows, got {type(data).__name__}")
    prefix = f"{key}[" if key else "item "
    return _rows_of(data, p, lambda i: f"{p}:{prefix}{i + 1}{']' if key else ''}", column_map)


def _load_csv(p: Path, column_map) -> JsonlRows:
    import csv
    rows, lines = [], []
    with io.StringIO(read_text(p), newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t" if p.suffix.lower() == ".tsv" else ",")
        start = 2
        for row in reader:
            at = f"{p}:{start}"
            if None in row:
                raise DataError(f"{at}: more fields than the header's {len(reader.fieldnames)} columns "
                                f"({', '.join(reader.fieldnames)}); quote fields that contain the delimiter")
            if any(v is None for v in row.values()):
                missing = [k for k, v in row.items() if v is None]
                raise DataError(f"{at}: missing column {missing[0]!r} (the row has fewer fields than the header)")
            rows.append(_checked(rename_columns(dict(row), column_map), at, column_map, p.parent))
            lines.append(start)
            start = reader.line_num + 1
    if not rows:
        raise DataError(f"--data: {p} has no rows")
    return JsonlRows(rows, p, lines)


def _load_with_datasets(p: Path, fmt: str, split: str, column_map) -> JsonlRows:
    try:
        import datasets
    except ImportError:
        raise DataError(f"--data: {p} is a {fmt} data set, which needs the 'datasets' package: "
                        f"pip install 'grpolab[data]' (JSONL, JSON and CSV need nothing)") from None
    try:
        if fmt == "parquet":
            ds = datasets.load_dataset("parquet", data_files={split: str(p)}, split=split)
        elif fmt == "save_to_disk":
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(str(p), split=split)  # a folder of data files, or a script
    except Exception as e:  # noqa: BLE001 - every loader error becomes a DataError naming the file
        raise DataError(f"--data: {p} ({fmt}) could not be loaded by datasets: {type(e).__name__}: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"--data: {p} has splits {', '.join(ds)} and no '{split}'; choose one with "
                            f"--data_split NAME")
        ds = ds[split]
    return _rows_of(ds.to_list(), p, lambda i: f"{p}:row {i + 1}", column_map)


def subset(rows: JsonlRows | list, idx: list[int]) -> JsonlRows:
    """Rows ``idx`` of ``rows``, keeping each row's file and line."""
    lines = rows.lines if isinstance(rows, JsonlRows) else []
    return JsonlRows([rows[i] for i in idx], getattr(rows, "path", None),
                     [lines[i] for i in idx] if len(lines) == len(rows) else [])


def held_out_count(n: int, eval_split: float, cap: int) -> int:
    """Rows to hold out of ``n``: ``eval_split`` is a fraction (0 < x < 1, rounded: 0 rows when the data is too
    small) or a count (>= 1), at most ``cap`` (eval_problems: no row is held out that would not be evaluated);
    0 = none."""
    if eval_split < 0 or (eval_split >= 1 and eval_split != int(eval_split)):
        raise DataError(f"eval_split: {eval_split} is neither a fraction in [0, 1) nor a whole number of rows")
    k = int(eval_split) if eval_split >= 1 else round(n * eval_split)
    return min(k, cap)


def split_held_out(rows: list, eval_split: float, seed: int, cap: int, source: str = "--data"):
    """``(train, eval)``: a seeded random ``eval_split`` of ``rows`` held out (never trained on), the rest in
    their file order. Refuses when nothing would be left to train on."""
    k = held_out_count(len(rows), eval_split, cap)
    if k == 0:
        return rows, subset(rows, [])
    if k >= len(rows):
        raise DataError(f"eval_split {eval_split}: {source} has {len(rows)} row(s); holding out {k} leaves none to "
                        f"train on. Give --eval_data FILE, a smaller --eval_split, or --eval_split 0 (no "
                        f"held-out evaluation)")
    import random
    held = sorted(random.Random(seed).sample(range(len(rows)), k))
    keep = sorted(set(range(len(rows))) - set(held))
    return subset(rows, keep), subset(rows, held)


def load_user_data(cfg):
    """``(train rows, eval rows, description)`` of --data: eval rows from --eval_data, else a seeded
    ``eval_split`` held out of --data (docs/data.md). The description is stated in the log and summary.json.
    ``cfg``: a grpolab Config (its data, data_split, column_map, prompt_column, eval_data, eval_data_split,
    eval_split, seed and eval_problems)."""
    cmap = parse_column_map(cfg.column_map, cfg.prompt_column)
    rows = load_data(cfg.data, cfg.data_split, cmap)
    if cfg.eval_data:
        train, held = rows, load_data(cfg.eval_data, cfg.eval_data_split or cfg.data_split, cmap)
        info = {"source": cfg.eval_data, "rows": min(len(held), cfg.eval_problems)}
    else:
        train, held = split_held_out(rows, cfg.eval_split, cfg.seed, cfg.eval_problems, f"--data {cfg.data}")
        info = {"source": f"held out of {cfg.data}", "eval_split": cfg.eval_split, "seed": cfg.seed,
                "rows": len(held)}
    info.update(train_source=cfg.data, train_rows=len(train))
    return train, held, info


def columns_of(rows: list[dict]) -> set[str]:
    """Columns present in every row (the ones a reward function may rely on)."""
    cols = set(rows[0])
    for r in rows[1:]:
        cols &= set(r)
    return cols - {"prompt"}


def render_prompt(tokenizer, prompt) -> str:
    """Chat messages go through the tokenizer's chat template with the generation
    prompt; plain strings are used as they are (TRL's behaviour)."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def tokenize_prompts(tokenizer, prompts: list, max_prompt_length: int):
    """``(input_ids, attention_mask)`` of the rendered prompts (:func:`render_prompt`), padded as the tokenizer
    pads (left for grpolab's tokenizers); a prompt longer than ``max_prompt_length`` tokens is a ValueError."""
    texts = [render_prompt(tokenizer, p) for p in prompts]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    if enc["input_ids"].shape[1] > max_prompt_length:
        raise ValueError(f"a prompt has {enc['input_ids'].shape[1]} tokens, more than max_prompt_length="
                         f"{max_prompt_length}; raise max_prompt_length or shorten the prompt")
    return enc["input_ids"], enc["attention_mask"]


_INT = re.compile(r"-?\d+")


def completion_text(completion) -> str:
    """Text of a completion given as a string or as chat messages (TRL's two formats)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def last_int(text: str) -> int | None:
    found = _INT.findall(text)
    return int(found[-1]) if found else None


def model_texts(rows: list[dict]) -> list[str]:
    """Every string of ``rows`` (plain values and chat-message contents): what a tiny model's tokenizer must cover."""
    out = []
    for row in rows:
        for v in row.values():
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, list):
                out.extend(message_text(m["content"]) for m in v if isinstance(m, dict) and "content" in m)
    return out
