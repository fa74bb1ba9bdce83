"""Reading notebooks without a 3-second wait.

nbformat validates notebooks with jsonschema, and importing jsonschema imports `rfc3987_syntax`
when it is installed (jupyter-events asks for it), which builds its parsers then: 2.8 s on a
2-core machine, in every process that reads a notebook. Those parsers check the "iri" format of a
JSON schema, and the notebook schema has no field of that format; so the processes that read
notebooks (the course's command line, the test runs) leave that package out. JupyterLab's own
processes are not touched.
"""

import sys

if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)  # `import rfc3987_syntax` now raises ImportError
