"""The shipped JSON Schemas (dfmp2/io/schemas) applied to the documents the tests see,
imported as ``from json_schema import ...``.

``checked(doc)`` validates a result, gradient, optimize, frequencies, interaction or CBS
document against its schema and returns it; ``read(path)`` does so for a file.
``validating_writes(monkeypatch)`` (tests/conftest.py applies it to every test) validates each
such document as dfmp2 writes it in the test's process (``dfmp2.io.outputs.write_text``, which
every --json writer calls): a document a CLI test makes that the schema refuses fails that test.
Subprocess runs are checked where their JSON is read.
"""

import functools
import json

# the maps of a document keyed by what ran (stage names): their keys are data, not the shape
STAGE_MAPS = ("timings", "flops", "peak_rss_mb", "times", "stages_mb", "phases_mb")


@functools.cache
def _validator(name: str):
    from dfmp2.io import schemas

    return schemas.validator(name)


def document_kind(doc) -> str | None:
    """The schema name of a dfmp2 document (``dfmp2.io.schemas.kind``: 'result', 'gradient',
    'optimize', 'frequencies', 'interaction', 'cbs', or the reports 'compare', 'regress',
    'bench'), else None (a QCSchema record, a checkpoint ...)."""
    from dfmp2.io import schemas

    if not isinstance(doc, dict):
        return None
    if str(doc.get("schema", "")).startswith("dfmp2-frequencies/"):
        return "frequencies"
    if (doc.get("kind") == "cbs" and "components" in doc) or "interaction_energies" in doc:
        return schemas.kind(doc)
    if {"energies", "ran", "shapes", "schema_version"} <= set(doc):
        return schemas.kind(doc)
    reports = ({"problem", "devices_requested", "summary"}, {"meta", "summary", "cases"}, {"meta", "ops", "gemm_peak"})
    if any(keys <= set(doc) for keys in reports):  # compare's, regress's, bench's
        return schemas.kind(doc)
    return None


def checked(doc: dict, name: str | None = None) -> dict:
    """``doc`` after validating it against its schema (``name``, default its ``document_kind``);
    an AssertionError naming every failing path otherwise."""
    name = name or document_kind(doc)
    assert name is not None, f"not a dfmp2 document: {sorted(doc)[:12]}"
    errors = sorted(_validator(name).iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, f"{name} document fails its schema: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}" for e in errors[:5]
    )
    return doc


def read(path) -> dict:
    """The JSON document at ``path``, validated (``checked``)."""
    with open(path, encoding="utf-8") as f:
        return checked(json.load(f))


def key_paths(doc, prefix: str = "") -> set:
    """Every key path of ``doc`` ('ran/scf/stability'), lists' items merged ('[]'), not descending
    into the stage maps (STAGE_MAPS) or into null: what must be the same for RHF and UHF."""
    out = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            path = f"{prefix}/{k}"
            out.add(path)
            if k not in STAGE_MAPS:
                out |= key_paths(v, path)
    elif isinstance(doc, list):
        for v in doc:
            out |= key_paths(v, prefix + "[]")
    return out


def validating_writes(monkeypatch) -> None:
    """Validate every dfmp2 document (``document_kind``) written through
    ``dfmp2.io.outputs.write_text`` in this process before it is written."""
    from dfmp2.io import outputs

    original = outputs.write_text

    def write_text(path, text, *args, **kwargs):
        if isinstance(text, str) and text.lstrip().startswith("{"):
            try:
                doc = json.loads(text)
            except ValueError:
                doc = None
            if document_kind(doc) is not None:
                checked(doc)
        return original(path, text, *args, **kwargs)

    monkeypatch.setattr(outputs, "write_text", write_text)
