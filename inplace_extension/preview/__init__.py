"""``plan``'s preview of an update: read old and new objects (``inputs``), judge them with the service's
own functions (``judge``), say what it found (``model``, ``render``)."""
