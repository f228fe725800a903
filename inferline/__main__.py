from inferline.cli import main

raise SystemExit(main())
