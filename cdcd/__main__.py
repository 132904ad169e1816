from cdcd.entry import main

raise SystemExit(main())
