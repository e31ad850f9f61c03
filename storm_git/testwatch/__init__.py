"""Tests run on the shared head as writes land, newly failing tests traced to the
writes that broke them, and the implicated agents told (``git storm watch``)."""
