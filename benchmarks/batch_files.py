"""Training and held-out batches saved as NumPy files, so a benchmark can train
where seqio and TensorFlow are not installed (e.g. Keras on JAX on a GPU host).

`export` writes the exact batches the seqio pipeline yields (the first `steps`
training batches of each seed, and every held-out batch); `load_train` and
`load_held_out` read them back as the `(x, y, sample_weight)` triples
`model.fit` takes. Integers are stored in the narrowest dtype that holds them.

Example:

>>> import tempfile, numpy as np
>>> batch = ({"ids": np.array([[3, 4]], np.int32)}, np.array([[4, 1]], np.int32),
...          np.array([[1.0, 0.0]], np.float32))
>>> d = tempfile.mkdtemp()
>>> write_batches(os.path.join(d, "b.npz"), [batch, batch])
>>> [x["ids"].tolist() for x, _, _ in read_batches(os.path.join(d, "b.npz"))]
[[[3, 4]], [[3, 4]]]
"""

import json
import os

import numpy as np

META = "meta.json"


def _narrow(array):
    array = np.asarray(array)
    if array.dtype.kind in "iu" and array.size:
        for dtype in (np.int16, np.int32):
            if np.iinfo(dtype).min <= array.min() and array.max() <= np.iinfo(dtype).max:
                return array.astype(dtype)
    return array


def write_batches(path, batches):
    """Saves `(x: dict, y, w)` batches (same keys in every batch) to one .npz."""
    arrays = {}
    for i, (x, y, w) in enumerate(batches):
        arrays.update({f"{i}/x/{k}": _narrow(v) for k, v in x.items()})
        arrays[f"{i}/y"] = _narrow(y)
        arrays[f"{i}/w"] = np.asarray(w)
    np.savez_compressed(path, **arrays)


def read_batches(path):
    """The batches `write_batches` saved, in order, as int32 / float32 arrays."""
    with np.load(path) as f:
        count = 1 + max(int(name.split("/")[0]) for name in f.files)
        batches = []
        for i in range(count):
            prefix = f"{i}/x/"
            x = {
                name[len(prefix) :]: f[name].astype(np.int32)
                for name in f.files
                if name.startswith(prefix)
            }
            batches.append((x, f[f"{i}/y"].astype(np.int32), f[f"{i}/w"].astype(np.float32)))
    return batches


def export(directory, train_datasets, held_out, meta):
    """Writes `train_seed{S}.npz` (each dataset's first `meta["steps"]` batches),
    `held_out.npz` and `meta.json` under `directory`.

    Args:
      train_datasets: {seed: iterable of (x, y, w) batches}.
      held_out: finite iterable of (x, y, w) batches.
      meta: JSON-able facts the reader needs (task, lengths, vocab size, steps, ...).
    """
    import itertools

    os.makedirs(directory, exist_ok=True)
    for seed, dataset in train_datasets.items():
        write_batches(
            os.path.join(directory, f"train_seed{seed}.npz"),
            itertools.islice(iter(dataset), meta["steps"]),
        )
    write_batches(os.path.join(directory, "held_out.npz"), held_out)
    with open(os.path.join(directory, META), "w") as f:
        json.dump({**meta, "seeds": sorted(train_datasets)}, f, indent=2, sort_keys=True)


def read_meta(directory):
    with open(os.path.join(directory, META)) as f:
        return json.load(f)


def load_train(directory, seed):
    """An endless generator of the saved training batches of `seed`, in order
    (a model trained past the saved steps would see them again)."""
    batches = read_batches(os.path.join(directory, f"train_seed{seed}.npz"))

    def generate():
        while True:
            yield from batches

    return generate()


def load_held_out(directory):
    """The held-out batches concatenated into one `(x, y, w)` triple: with
    `batch_size` = the saved batch size, Keras splits it into the same batches."""
    batches = read_batches(os.path.join(directory, "held_out.npz"))
    x = {k: np.concatenate([b[0][k] for b in batches]) for k in batches[0][0]}
    return (x, np.concatenate([b[1] for b in batches]), np.concatenate([b[2] for b in batches]))
