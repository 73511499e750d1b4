"""python -m litlab.report <folders...>"""

from litlab.report import main

main()
