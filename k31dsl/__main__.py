from k31dsl.cli import main

raise SystemExit(main())
