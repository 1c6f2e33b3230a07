from nekomem.cli.main import main

raise SystemExit(main())
