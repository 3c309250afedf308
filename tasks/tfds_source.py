"""A `seqio.TfdsDataSource` that says how to get its data when it is missing."""

import seqio

from keras_moe.tasks.errors import SourceMissingError


class CheckedTfdsSource(seqio.TfdsDataSource):
    """TFDS source that raises `SourceMissingError` naming `fix` if unprepared.

    The check runs when data is requested (get_dataset, list_shards,
    num_input_examples), never at registration.  Loading itself is seqio's own
    TFDS path, unchanged.

    Args:
      tfds_name: "name/config:version", e.g. "c4/en:3.0.1".
      fix: what to run or set to provide the data, shown in the error.
      tfds_data_dir: TFDS data dir (default: $TFDS_DATA_DIR or
        ~/tensorflow_datasets).
      splits: optional seqio split map.

    Example:
      >>> src = CheckedTfdsSource("c4/en:3.0.1", fix="tfds build c4/en:3.0.1")
    """

    def __init__(self, tfds_name, fix, tfds_data_dir=None, splits=None):
        super().__init__(tfds_name=tfds_name, tfds_data_dir=tfds_data_dir, splits=splits)
        self._tfds_name = tfds_name
        self._fix = fix

    def check(self):
        """Raises SourceMissingError unless the TFDS data is prepared."""
        where = self.tfds_dataset.data_dir or "$TFDS_DATA_DIR or ~/tensorflow_datasets"
        try:
            prepared = self.tfds_dataset.builder.is_prepared()
        except Exception as e:  # tfds raises several types for absent data.
            raise SourceMissingError(
                f"TFDS dataset {self._tfds_name}",
                self._fix,
                detail=f"data dir {where}; {type(e).__name__}: {str(e)[:300]}",
            ) from e
        if not prepared:
            raise SourceMissingError(
                f"TFDS dataset {self._tfds_name}", self._fix, detail=f"not prepared in {where}"
            )

    def get_dataset(self, *args, **kwargs):
        self.check()
        return super().get_dataset(*args, **kwargs)

    def list_shards(self, split):
        self.check()
        return super().list_shards(split)

    def num_input_examples(self, split):
        self.check()
        return super().num_input_examples(split)
