"""Theano's ``theano.misc.pkl_utils``: pickle an object into a zip file whose NumPy arrays
are kept as ``.npy`` members, named after their shared variables.

The zip holds the pickle as the member ``pkl`` and every array the object holds as an
``.npy`` member (a shared variable's under its name, numbered ``name_2``, ``name_3``, ...
where names repeat; others as ``array_0``, ``array_1``, ...), so :func:`numpy.load` reads
the values without unpickling anything. Theano's GPU arrays (``PersistentGpuArrayID``) and
its ``StripPickler`` have no counterpart: values are NumPy arrays here.

>>> import io, numpy as np
>>> from synkhronos import theano
>>> w = theano.shared(np.arange(3.0), name="W")
>>> buffer = io.BytesIO()
>>> dump([w, w], buffer)
>>> saved = np.load(io.BytesIO(buffer.getvalue()))
>>> sorted(saved.files), saved["W"].tolist()
(['W', 'pkl'], [0.0, 1.0, 2.0])
>>> loaded = load(io.BytesIO(buffer.getvalue()))
>>> loaded[0] is loaded[1], loaded[0].get_value().tolist()
(True, [0.0, 1.0, 2.0])
"""

import io
import pickle
import zipfile
from collections import defaultdict
from collections.abc import Callable
from typing import IO, Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable

__all__ = [
    "PersistentNdarrayID",
    "PersistentNdarrayLoad",
    "PersistentSharedVariableID",
    "dump",
    "load",
]

_PICKLE = "pkl"  # the zip member holding the pickle itself


class PersistentNdarrayID:
    """Writes each NumPy array an object holds to the zip as ``array_<n>`` (once per array)
    and gives the pickle ``"ndarray.<member>"`` in its place.

    Parameters
    ----------
    zip_file : zipfile.ZipFile
        Open for writing.
    """

    def __init__(self, zip_file: zipfile.ZipFile):
        self.zip_file = zip_file
        self.count = 0
        self.seen: dict[int, str] = {}

    def _resolve_name(self, obj: np.ndarray) -> str:
        name = f"array_{self.count}"
        self.count += 1
        return name

    def __call__(self, obj: Any) -> str | None:
        if type(obj) is not np.ndarray:
            return None  # pickled in place
        if id(obj) not in self.seen:
            name = self._resolve_name(obj)
            with self.zip_file.open(name, "w") as member:
                np.lib.format.write_array(member, obj)
            self.seen[id(obj)] = f"ndarray.{name}"
        return self.seen[id(obj)]


class PersistentSharedVariableID(PersistentNdarrayID):
    """As :class:`PersistentNdarrayID`, naming a shared variable's value after the variable.

    Parameters
    ----------
    zip_file : zipfile.ZipFile
    allow_unnamed : bool
        With False, an unnamed shared variable raises ValueError.
    allow_duplicates : bool
        With False, two shared variables of one name raise ValueError.
    """

    def __init__(
        self, zip_file: zipfile.ZipFile, allow_unnamed: bool = True, allow_duplicates: bool = True
    ):
        super().__init__(zip_file)
        self.allow_unnamed = allow_unnamed
        self.allow_duplicates = allow_duplicates
        self.name_counter: defaultdict[str, int] = defaultdict(int)
        self.ndarray_names: dict[int, str] = {}

    def _resolve_name(self, obj: np.ndarray) -> str:
        if id(obj) not in self.ndarray_names:
            return super()._resolve_name(obj)
        name = self.ndarray_names[id(obj)]
        self.name_counter[name] += 1
        if self.name_counter[name] == 1:
            return name
        if not self.allow_duplicates:
            raise ValueError(f"two shared variables are named {name!r}")
        return f"{name}_{self.name_counter[name]}"

    def __call__(self, obj: Any) -> str | None:
        if isinstance(obj, SharedVariable):
            if obj.name == _PICKLE:
                raise ValueError(f"a shared variable named {_PICKLE!r} would overwrite the pickle")
            if obj.name:
                self.ndarray_names[id(obj.container.storage[0])] = obj.name
            elif not self.allow_unnamed:
                raise ValueError(f"unnamed shared variable {obj}")
        return super().__call__(obj)


class PersistentNdarrayLoad:
    """Reads back the arrays :class:`PersistentNdarrayID` wrote (each member once, so arrays
    shared in the dumped object are shared in the loaded one).

    Parameters
    ----------
    zip_file : zipfile.ZipFile
        Open for reading.
    """

    def __init__(self, zip_file: zipfile.ZipFile):
        self.zip_file = zip_file
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, persid: str) -> np.ndarray:
        kind, name = persid.split(".", 1)
        if kind != "ndarray":
            raise pickle.UnpicklingError(f"{persid!r}: only NumPy arrays are stored here")
        if name not in self.cache:
            with self.zip_file.open(name) as member:
                self.cache[name] = np.lib.format.read_array(io.BytesIO(member.read()))
        return self.cache[name]


def dump(
    obj: Any,
    file_handler: IO[bytes],
    protocol: int = pickle.DEFAULT_PROTOCOL,
    persistent_id: Callable[[zipfile.ZipFile], Callable] = PersistentSharedVariableID,
) -> None:
    """Pickle ``obj`` into a zip file, its arrays as ``.npy`` members.

    Parameters
    ----------
    obj
        What to save (a shared variable, a list of a network's parameters, ...).
    file_handler
        A file opened for binary writing.
    protocol : int
        The pickle protocol.
    persistent_id
        Given the open zip file, returns the pickler's ``persistent_id``.
    """
    with zipfile.ZipFile(file_handler, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as zip_file:
        pickled = io.BytesIO()
        pickler = pickle.Pickler(pickled, protocol=protocol)
        pickler.persistent_id = persistent_id(zip_file)  # type: ignore[method-assign]
        pickler.dump(obj)
        zip_file.writestr(_PICKLE, pickled.getvalue())


def load(
    f: IO[bytes], persistent_load: Callable[[zipfile.ZipFile], Callable] = PersistentNdarrayLoad
) -> Any:
    """Load what :func:`dump` saved.

    Parameters
    ----------
    f
        A file opened for binary reading.
    persistent_load
        Given the open zip file, returns the unpickler's ``persistent_load``.

    Returns
    -------
    object
        The dumped object, its shared variables holding the saved values.
    """
    with zipfile.ZipFile(f, "r") as zip_file:
        unpickler = pickle.Unpickler(io.BytesIO(zip_file.read(_PICKLE)))
        unpickler.persistent_load = persistent_load(zip_file)  # type: ignore[method-assign]
        return unpickler.load()
