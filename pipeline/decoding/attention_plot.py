"""Attention matrices drawn as images (source tokens x target tokens)."""

import io

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from pipeline.core.atomic_files import atomic_path


def piece_label(piece):
    """A subword piece as a plot labels it (the browser example labels the same way): without
    SentencePiece's word-start mark U+2581, so labels read as text; a bare mark as ␣."""
    return piece.replace("\u2581", "") or "\u2423"


def attention_figure(hypothesis, title=None):
    """A matplotlib figure of `hypothesis.attention`: one row per target token, one column
    per source token, darker where the decoder looked. The caller closes it."""
    attention = hypothesis.attention
    rows, columns = attention.shape
    width = min(4 + 0.42 * columns, 40)
    height = min(2.5 + 0.38 * rows, 40)
    figure, axes = plt.subplots(figsize=(width, height), dpi=100)
    image = axes.imshow(attention, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(columns), [piece_label(p) for p in hypothesis.source_tokens], rotation=60,
                    ha="right", fontsize=11)  # fmt: skip
    axes.set_yticks(range(rows), [piece_label(p) for p in hypothesis.target_tokens], fontsize=11)
    axes.set_xlabel("source")
    axes.set_ylabel("translation")
    axes.set_title(title or hypothesis.text, fontsize=11, wrap=True)
    figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02, label="attention weight")
    figure.tight_layout()
    return figure


def plot_attention(hypothesis, path, title=None):
    """Writes `attention_figure(hypothesis, title)` to `path` as a PNG, atomically."""
    figure = attention_figure(hypothesis, title)
    with atomic_path(path) as tmp:
        figure.savefig(tmp)
    plt.close(figure)


def attention_png(hypothesis, title=None):
    """`attention_figure(hypothesis, title)` as PNG bytes."""
    figure = attention_figure(hypothesis, title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()
