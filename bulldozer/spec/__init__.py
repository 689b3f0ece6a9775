"""Job specs: the ``MoveDataToKvDal`` models and the position-keeping YAML loader."""

from bulldozer.spec.loader import LoadedSpec, load_spec, load_spec_text
from bulldozer.spec.models import (
    API_VERSION,
    KIND,
    CatalogConfig,
    DataMovement,
    DuplicateKeys,
    JobSpec,
    KeyValueDal,
    Metadata,
    ProtobufConfig,
    QualityGates,
    Retention,
    Source,
    WriteTuning,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "CatalogConfig",
    "DataMovement",
    "DuplicateKeys",
    "JobSpec",
    "KeyValueDal",
    "LoadedSpec",
    "Metadata",
    "ProtobufConfig",
    "QualityGates",
    "Retention",
    "Source",
    "WriteTuning",
    "load_spec",
    "load_spec_text",
]
